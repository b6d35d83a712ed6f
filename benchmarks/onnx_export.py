"""ONNX export of full-width AA-ResNet-50 / GSA-ResNet-50 and RetinaNets,
checked in onnxruntime.

Models (``--models``; ResNet-50 is the control without attention):

* ``ResNet-50``, ``AA-ResNet-50``, ``GSA-ResNet-50``: the backbone of mmdet's
  RetinaNet (``mmdet::_base_/models/retinanet_r50_fpn.py``:
  ``frozen_stages=1``, ``norm_eval=True``, four outputs) with ``type`` swapped;
* ``RetinaNet AA-ResNet-50``, ``RetinaNet GSA-ResNet-50``: mmdet's RetinaNet +
  FPN with that backbone; exported is the network's tensor part,
  ``model._forward`` (backbone, neck, head: the 5 classification and 5 box
  maps), without the anchor decoding and NMS of ``predict``.

No trained weights exist here, so each model gets a stand-in for training:
mmdet's init, the last BN of every residual branch at weight
``--residual-scale`` (mmdet's zero init would cut the attention off the
outputs; at 1 the untrained AA-ResNet-50 amplifies float32 rounding to a 1e-1
relative error at its outputs and GSA-ResNet-50 turns non-finite at some
inputs, which hides any export error), then BN statistics averaged over
``--calib-images`` N(0, 1) images at the export size (the first pass a learning
pass: the relative tables record that size's offsets and clip beyond, as after
training), then evaluation mode; checked on N(0, 1) images.

Each model is exported at ``--export-size`` with dynamic height and width by
both exporters: TorchScript-based (``torch.onnx.export(..., dynamo=False)``,
opset 17, what mmdeploy uses) and dynamo (``dynamo=True``, torch >= 2.6).
onnxruntime (CPU, one thread) then runs the export size and each of
``--check-sizes``. Printed per (model, exporter): the export time, and per size
the relative error ``||ort - torch|| / ||torch||`` (Frobenius norm, the largest
over the outputs); per (model, size) also PyTorch's own float32 error against
the same model in float64, the scale of what any float32 runtime can be
expected to match.

    .venv/bin/python benchmarks/onnx_export.py [--models ...]
        [--exporters torchscript dynamo] [--export-size 320x320]
        [--check-sizes 256x384 448x320] [--calib-images 32]
        [--residual-scale 0.25]

A model or exporter that fails prints its traceback and ``fails: <error>`` in
its row; the others go on.
"""
import argparse
import copy
import logging
import os.path as osp
import sys
import tempfile
import time
import traceback
import warnings

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'tools', 'env'))
from env_check import require_env  # noqa: E402

require_env()

import mmdet  # noqa: E402
import torch  # noqa: E402
from mmdet.models.backbones.resnet import Bottleneck  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.logging import MMLogger  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from torch.nn.modules.batchnorm import _BatchNorm  # noqa: E402

import aa_det  # noqa: E402,F401  (registers the backbones)
from aa_det.utils.compat import TORCH_VERSION  # noqa: E402

RETINANET = osp.join(
    osp.dirname(mmdet.__file__), '.mim', 'configs', '_base_', 'models',
    'retinanet_r50_fpn.py')
BACKBONES = {
    'ResNet-50': 'ResNet',
    'AA-ResNet-50': 'AAResNet',
    'GSA-ResNet-50': 'GSAResNet'
}
MODEL_NAMES = [*BACKBONES, 'RetinaNet AA-ResNet-50', 'RetinaNet GSA-ResNet-50']


class TensorOutputs(torch.nn.Module):
    """A model's outputs as one flat tuple of tensors: a backbone's stages, or
    a detector's ``_forward`` (classification maps, then box maps)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        if hasattr(self.model, '_forward'):
            cls_scores, bbox_preds = self.model._forward(x)
            return (*cls_scores, *bbox_preds)
        return tuple(self.model(x))


def build(name: str, residual_scale: float) -> torch.nn.Module:
    """``name`` from mmdet's RetinaNet config, initialised, every residual
    branch's last BN (``norm3``) at weight ``residual_scale``."""
    model_cfg = Config.fromfile(RETINANET).model
    backbone = model_cfg.backbone
    backbone.update(
        type=BACKBONES[name.split(' ')[-1]],
        init_cfg=None,
        zero_init_residual=False)
    model = MODELS.build(
        model_cfg if name.startswith('RetinaNet') else backbone)
    model.init_weights()
    for m in model.modules():
        if isinstance(m, Bottleneck):
            m.norm3.weight.data.fill_(residual_scale)
    return model


def calibrate(model: TensorOutputs, size, images: int):
    """BN statistics (every BN, the frozen stage's too): the average over
    ``images`` N(0, 1) images of ``size``, two per training-mode pass; the
    first pass is a learning pass (the relative tables record its offsets).
    Then evaluation mode, the wrapper's too: the TorchScript exporter restores
    the training flag of the module it gets on all its submodules."""
    model.train()
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            m.momentum = None
            m.reset_running_stats()
            m.train()
    torch.manual_seed(0)
    for i in range(0, images, 2):
        with torch.set_grad_enabled(i == 0):
            model(torch.randn(2, 3, *size))
    model.eval()


def export(model: torch.nn.Module, num_outputs: int, size, path: str,
           exporter: str) -> float:
    """Export with dynamic H/W; seconds taken."""
    x = torch.randn(1, 3, *size)
    start = time.perf_counter()
    if exporter == 'dynamo':
        from torch.export import Dim
        dims = {2: Dim('H', min=32, max=4096), 3: Dim('W', min=32, max=4096)}
        torch.onnx.export(
            model, (x, ),
            path,
            dynamo=True,
            input_names=['x'],
            dynamic_shapes={'x': dims})
    else:
        # `dynamo=` exists from torch 2.5
        legacy = {} if TORCH_VERSION < (2, 5) else {'dynamo': False}
        names = [f'y{i}' for i in range(num_outputs)]
        torch.onnx.export(
            model, (x, ),
            path,
            input_names=['x'],
            output_names=names,
            opset_version=17,
            dynamic_axes={n: {
                2: 'H',
                3: 'W'
            }
                          for n in ['x', *names]},
            **legacy)
    return time.perf_counter() - start


def size_arg(text: str):
    """``HxW`` -> ``(H, W)``."""
    try:
        h, w = map(int, text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'aa_det: a size is HxW, e.g. 320x320; got {text!r}') from None
    return h, w


def relative_error(outputs, references) -> float:
    """The largest ``||out - ref|| / ||ref||`` over the outputs (float64
    norms)."""
    return max(((o.double() - r.double()).norm() / r.double().norm()).item()
               for o, r in zip(outputs, references))


def row_text(name: str, exporter: str, seconds, errors) -> str:
    """One markdown table row: errors per size, or the failure."""
    cells = [f'{e:.1e}' for e in errors] if isinstance(
        errors, list) else [f'fails: {errors}']
    return (f'| {name} | {exporter} | '
            f'{"-" if seconds is None else f"{seconds:.0f}"} | ' + ' '
            '|'
            ' '.join(cells) + ' |')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--models', nargs='+', default=MODEL_NAMES, choices=MODEL_NAMES)
    parser.add_argument(
        '--exporters',
        nargs='+',
        default=['torchscript', 'dynamo'],
        choices=['torchscript', 'dynamo'])
    parser.add_argument(
        '--export-size', type=size_arg, default=(320, 320), help='HxW')
    parser.add_argument(
        '--check-sizes',
        type=size_arg,
        nargs='+',
        default=[(256, 384), (448, 320)],
        help='HxW sizes checked besides the export size')
    parser.add_argument(
        '--calib-images',
        type=int,
        default=32,
        help='images for the BN statistics')
    parser.add_argument(
        '--residual-scale',
        type=float,
        default=0.25,
        help="weight of every residual branch's last BN")
    args = parser.parse_args()
    import onnxruntime as ort

    MMLogger.get_current_instance().setLevel(logging.WARNING)
    warnings.filterwarnings('ignore', category=torch.jit.TracerWarning)
    init_default_scope('mmdet')
    exporters = [
        e for e in args.exporters
        if e == 'torchscript' or TORCH_VERSION >= (2, 6)
    ]
    if exporters != args.exporters:
        print(f'dynamo exporter skipped: torch {torch.__version__} < 2.6')
    sizes = [args.export_size, *args.check_sizes]
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    print(
        f'torch {torch.__version__}, onnxruntime {ort.__version__}; export at '
        f'{sizes[0]}, relative error at {", ".join(map(str, sizes))}',
        flush=True)
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        model = TensorOutputs(build(name, args.residual_scale))
        calibrate(model, sizes[0], args.calib_images)
        model64 = copy.deepcopy(model).double()
        inputs, references, fp32_error = {}, {}, {}
        with torch.no_grad():
            for size in sizes:
                inputs[size] = torch.randn(
                    1, 3, *size, generator=torch.Generator().manual_seed(1))
                references[size] = model(inputs[size])
                fp32_error[size] = relative_error(
                    references[size], model64(inputs[size].double()))
        del model64
        rows.append(
            (name, 'torch fp32 vs fp64', None, [fp32_error[s] for s in sizes]))
        print(row_text(*rows[-1]), flush=True)
        for exporter in exporters:
            with tempfile.TemporaryDirectory() as tmp:
                path = osp.join(tmp, 'model.onnx')
                try:
                    seconds = export(model, len(references[sizes[0]]),
                                     sizes[0], path, exporter)
                    sess = ort.InferenceSession(
                        path, options, providers=['CPUExecutionProvider'])
                    errors = [
                        relative_error([
                            torch.from_numpy(o) for o in sess.run(
                                None,
                                {sess.get_inputs()[0].name: inputs[s].numpy()})
                        ], references[s]) for s in sizes
                    ]
                # a failing export is a result: printed, the rest goes on
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    seconds, errors = (None, f'{type(e).__name__}: '
                                       f'{(str(e).splitlines() or [""])[0]}')
            rows.append((name, exporter, seconds, errors))
            print(row_text(*rows[-1]), flush=True)

    print('\n| model | exporter | export s | ' +
          ' | '.join(f'{h}x{w}' + (' (export)' if i == 0 else '')
                     for i, (h, w) in enumerate(sizes)) + ' |')
    print('|---|---|---|' + '---|' * len(sizes))
    for row in rows:
        print(row_text(*row))


if __name__ == '__main__':
    main()
