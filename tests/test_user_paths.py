"""What a user runs: --amp on the CPU, TensorBoard logging, COCO files without
``info``, the annotation check, and mmdet's own analysis tools on our
configs."""
import glob
import json
import math
import os
import os.path as osp
import re

import pytest
import torch
from config_runner import build_runner, load_config
from demo_config import DEMO, ROOT, demo_options
from synthetic_shapes import generate_shapes_coco
from tool_process import run_python

from aa_det.utils import ConfigError
from aa_det.utils.compat import autocast_dtype

TRAIN = osp.join(ROOT, 'tools/train.py')
# as the other tool tests: no thread oversubscription
ENV = dict(os.environ, OMP_NUM_THREADS='1')
ONE_EPOCH = {
    'train_cfg.max_epochs': 1,
    'train_dataloader.batch_size': 4,
    # an untrained model still gets scored
    'model.test_cfg.score_thr': 0.0,
    'default_hooks.logger.interval': 1
}


def run_tool(*args, options=None):
    cmd = list(args)
    if options:
        cmd += ['--cfg-options'] + [f'{k}={v}' for k, v in options.items()]
    return run_python(cmd, env=ENV, cwd=ROOT)


def train_losses(log):
    """The ``loss`` values of the training lines of an mmengine log."""
    return [
        float(v) for v in re.findall(r'Epoch\(train\).*?\bloss: (\S+)', log)
    ]


def test_train_amp_on_cpu_runs_bf16_and_logs_to_tensorboard(
        tiny_shapes, tmp_path):
    """``tools/train.py --amp`` without a GPU (mmengine's AmpOptimWrapper
    asserts one) trains with CPUAmpOptimWrapper; the TensorBoard backend chosen
    by --cfg-options writes events."""
    out = run_tool(
        TRAIN,
        DEMO,
        '--amp',
        '--work-dir',
        tmp_path,
        options=demo_options(
            tiny_shapes, **ONE_EPOCH,
            **{'visualizer.vis_backends.0.type': 'TensorboardVisBackend'}))
    assert out.returncode == 0, out.stderr[-3000:]
    # the dumped config
    assert "type='CPUAmpOptimWrapper'" in (tmp_path /
                                           osp.basename(DEMO)).read_text()
    log = open(glob.glob(str(tmp_path / '*' / '*.log'))[0]).read()
    losses = train_losses(log)
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses), losses
    assert 'coco/bbox_mAP' in log
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    events = EventAccumulator(
        glob.glob(str(tmp_path / '*' / 'vis_data' /
                      'events.out.tfevents.*'))[0])
    assert {'loss', 'lr', 'coco/bbox_mAP'} <= set(
        events.Reload().Tags()['scalars'])


@pytest.mark.parametrize('backbone', ['AAResNet', 'GSAResNet'])
def test_amp_train_step_runs_the_forward_under_bf16_autocast(
        tiny_shapes, tmp_path, backbone, monkeypatch):
    """What --amp builds through load_config + build_runner: the backbone's
    forward runs under CPU bf16 autocast (bf16 features), the focal loss
    computes in float32 (mmcv's CUDA kernel has no bf16), losses and float32
    parameters stay finite."""
    import mmdet.models.losses.focal_loss as focal_loss
    loss_dtypes = []

    def recording(function):

        def wrapped(pred, *args, **kwargs):
            loss_dtypes.append(pred.dtype)
            return function(pred, *args, **kwargs)

        return wrapped

    # the CPU's and the CUDA kernel's path
    for name in ('py_sigmoid_focal_loss', 'sigmoid_focal_loss'):
        monkeypatch.setattr(focal_loss, name,
                            recording(getattr(focal_loss, name)))
    extra = dict(ONE_EPOCH)
    if backbone == 'GSAResNet':
        extra.update({
            'model.backbone':
            dict(
                _delete_=True,
                type='GSAResNet',
                depth=26,
                base_channels=32,
                norm_cfg=dict(type='BN'),
                norm_eval=False,
                init_cfg=None),
            'model.neck.in_channels': [128, 256, 512, 1024]
        })
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options=demo_options(tiny_shapes, **extra),
        amp=True)
    runner = build_runner(cfg)
    wrapper = runner.build_optim_wrapper(cfg.optim_wrapper)
    assert type(wrapper).__name__ == 'CPUAmpOptimWrapper'
    seen = []
    runner.model.backbone.register_forward_hook(
        lambda module, args, outputs: seen.append(
            (autocast_dtype('cpu'), outputs[-1].dtype)))
    batch = next(iter(runner.build_dataloader(cfg.train_dataloader)))
    log_vars = runner.model.train_step(batch, wrapper)
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    assert type(runner.model.bbox_head.loss_cls).__name__ == 'Float32FocalLoss'
    assert loss_dtypes and set(loss_dtypes) == {torch.float32}, loss_dtypes
    assert all(math.isfinite(float(v)) for v in log_vars.values()), log_vars
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all()
               for p in runner.model.parameters())


def test_amp_dtype_sets_the_cuda_wrappers_dtype(monkeypatch):
    """``tools/train.py --amp --amp-dtype bfloat16`` on CUDA: mmengine's
    AmpOptimWrapper with ``dtype='bfloat16'``; without --amp the flag is one
    clear error."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cfg = load_config(DEMO, amp=True, amp_dtype='bfloat16')
    assert (cfg.optim_wrapper.type,
            cfg.optim_wrapper.dtype) == ('AmpOptimWrapper', 'bfloat16')
    assert cfg.model.bbox_head.loss_cls.type == 'Float32FocalLoss'
    with pytest.raises(ConfigError, match='--amp-dtype bfloat16 needs --amp'):
        load_config(DEMO, amp_dtype='bfloat16')


def test_annotation_without_info_trains_and_evaluates(tmp_path):
    """A COCO file without the optional ``info`` key: pycocotools' loadRes
    needed it, so the run crashed in evaluation after training; now it
    evaluates (LenientCocoMetric)."""
    data = tmp_path / 'shapes'
    generate_shapes_coco(str(data), num_train=8, num_val=4, image_size=96)
    val = data / 'annotations' / 'instances_val.json'
    coco = json.loads(val.read_text())
    del coco['info']
    val.write_text(json.dumps(coco))
    out = run_tool(
        TRAIN,
        DEMO,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(data, **ONE_EPOCH))
    assert out.returncode == 0, out.stderr[-3000:]
    log = open(glob.glob(str(tmp_path / 'work' / '*' / '*.log'))[0]).read()
    assert re.search(r'Epoch\(val\).*coco/bbox_mAP: \d', log), log[-2000:]
    # the file is left as it was
    assert 'info' not in json.loads(val.read_text())


@pytest.mark.parametrize('text, error', [
    ('',
     r'not valid JSON: \S+instances.json, line 1, column 1: Expecting value'),
    ('  \n', r'not valid JSON: \S+instances.json, line 2, column 1'),
    ('garbage', r'not valid JSON: \S+instances.json, line 1, column 1'),
    ('[{"images": [], "annotations": [], "categories": []}]',
     r'is not a JSON object .*instances.json: it holds a list'),
    ('{"images": []}',
     r"has no top-level 'categories': \S+instances.json: its top-level keys "
     r"are \['images'\]"),
    ('{"images": [], "annotations": [], "categories": [1, 2]}',
     r'is not COCO format: \S+instances.json: TypeError'),
    ('\n { "images" : [],\n"annotations":[], "categories"\t: [{"id": 1, '
     '"name": "circle"}] }\n\n', None),
])
def test_annotation_file_problems_name_the_file(tmp_path, text, error):
    """What ``CheckedCocoDataset`` (our dataset bases) says of a file that is
    not COCO json, as it loads."""
    from aa_det.datasets import CheckedCocoDataset
    path = tmp_path / 'instances.json'
    path.write_text(text)
    dataset = dict(
        ann_file=str(path),
        data_prefix=dict(img=''),
        metainfo=dict(classes=('circle', )),
        pipeline=[],
        serialize_data=False)
    if error is None:
        assert len(CheckedCocoDataset(**dataset)) == 0
    else:
        with pytest.raises(ConfigError, match=error):
            CheckedCocoDataset(**dataset)


def test_mmdet_browse_dataset_runs_on_our_config(tiny_shapes, tmp_path):
    """mmdet's analysis tools ship in its wheel (mmdet/.mim/tools) and run our
    configs (custom_imports registers aa_det)."""
    import mmdet
    tool = osp.join(
        osp.dirname(mmdet.__file__), '.mim', 'tools', 'analysis_tools',
        'browse_dataset.py')
    out = run_tool(
        tool,
        DEMO,
        '--not-show',
        '--output-dir',
        tmp_path,
        options={'train_dataloader.dataset.data_root': str(tiny_shapes) + '/'})
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(glob.glob(str(tmp_path / '*.png'))) == 8


def test_classification_config_without_mmpretrain_is_one_line(monkeypatch):
    """mmengine raises ModuleNotFoundError for a package scope's base whose
    package is missing."""
    import mmengine.config.config as mmengine_config

    monkeypatch.setattr(mmengine_config, 'is_installed',
                        lambda package: package != 'mmpretrain')
    path = osp.join(ROOT, 'configs/imagenet/aa-resnet50_8xb32-100e_in1k.py')
    with pytest.raises(
            ConfigError,
            match=r'aa-resnet50_8xb32-100e_in1k.py: mmpretrain is not '
            r'installed.*: pip install mmpretrain==1.2.0 model-index '
            r'\(docs/setup.md\)$'):
        load_config(path)
