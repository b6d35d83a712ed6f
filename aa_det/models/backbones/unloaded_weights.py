"""What a backbone would train from other than the config says: weights nothing loaded.

mmengine loads a ``Pretrained`` checkpoint with ``strict=False``: a ResNet-50 checkpoint in an
AA-ResNet-50 leaves every attention weight and the reshaped 3x3 convs at their initialisation, with only
``The model and loaded state dict do not match exactly`` among hundreds of log lines. And mmdet's own
configs freeze the stem and stage 1 (``frozen_stages=1``) and every BatchNorm (``norm_eval=True``),
which from scratch freezes random values for the whole run.

:class:`UnloadedWeights` watches every load into the backbone (a ``load_state_dict`` pre-hook: mmengine's
``Pretrained`` init, ``load_from``, ``resume`` and torch's own ``load_state_dict`` all run it) from the start of
its ``init_weights``, and decides when training starts (:meth:`UnloadedWeights.check`, from the backbone's
``train()``: after a whole-detector ``load_from`` or ``resume`` has loaded what it loads, before the first
iteration):

* a frozen tensor (``frozen_stages``, ``norm_eval``, ``norm_cfg.requires_grad=False``) that nothing loaded is a
  :class:`ConfigError`: it can never train, so the run would be wrong to its end;
* a tensor that a ``Pretrained`` checkpoint did not hold (with its shape) is a warning naming how many and
  which: it trains from scratch, which may be meant (ImageNet convs, new attention).
"""
import re
from collections import Counter
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from mmengine.logging import print_log
from torch.nn.modules.batchnorm import _BatchNorm

from ...utils.errors import ConfigError


def _pretrained_checkpoints(init_cfg) -> List[str]:
    """The checkpoints of the ``Pretrained`` entries of an ``init_cfg`` (a dict, a list or None)."""
    cfgs = init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg] if init_cfg else []
    return [str(cfg.get('checkpoint')) for cfg in cfgs
            if isinstance(cfg, dict) and getattr(cfg.get('type'), '__name__', cfg.get('type')) in
            ('Pretrained', 'PretrainedInit')]


def summary(names: List[str], limit: int = 4) -> str:
    """``names`` grouped by their name inside a block (``layer2.0.conv2.qkv.weight`` ->
    ``conv2.qkv.weight``), most frequent first: ``'conv2.qkv.weight x4, conv2.proj.weight x4, ...'``."""
    counts = Counter(re.sub(r'^layer\d+\.\d+\.', '', name) for name in names)
    shown = ', '.join(f'{name} x{n}' if n > 1 else name for name, n in counts.most_common(limit))
    others = len(counts) - limit
    return shown + (f', and {others} other kind{"s" if others > 1 else ""}' if others > 0 else '')


class UnloadedWeights:
    """The parameters and BatchNorm statistics of one backbone that no load has filled since ``init_weights``
    began; see the module's docstring.

    Args:
        backbone (nn.Module): an mmdet ``ResNet`` (``frozen_stages``, ``norm_eval``, ``norm_cfg``, ``init_cfg``).
    """

    def __init__(self, backbone: nn.Module) -> None:
        self.name = type(backbone).__name__
        self.checkpoints = _pretrained_checkpoints(backbone.init_cfg)
        self.shapes = {k: v.shape for k, v in backbone.state_dict().items()}
        self.loaded = set()
        self.handle = backbone._register_load_state_dict_pre_hook(self.record)

    def record(self, state_dict, prefix, *args) -> None:
        """``load_state_dict`` pre-hook of the backbone: the keys the incoming state holds with their shape."""
        self.loaded.update(k for k, shape in self.shapes.items()
                           if prefix + k in state_dict and getattr(state_dict[prefix + k], 'shape', None) == shape)

    def unloaded(self, backbone: nn.Module):
        """``(frozen, trainable)``: the names of the parameters and BatchNorm statistics nothing loaded, those a
        run keeps as they are and the others."""
        params = dict(backbone.named_parameters())
        norms = [(name, m) for name, m in backbone.named_modules() if isinstance(m, _BatchNorm)]
        stats = {f'{name}.{key}' for name, m in norms for key in ('running_mean', 'running_var')}
        norm_keys = stats | {f'{name}.{key}' for name, m in norms for key in ('weight', 'bias')}
        unloaded = [k for k in self.shapes if (k in params or k in stats) and k not in self.loaded]
        frozen = [k for k in unloaded if (k in params and not params[k].requires_grad)
                  or (backbone.norm_eval and k in norm_keys)]
        return frozen, [k for k in unloaded if k in params and k not in frozen]

    def check(self, backbone: nn.Module) -> None:
        """At the first ``train()`` after ``init_weights``: refuse frozen tensors nothing loaded, warn of
        trainable ones a ``Pretrained`` checkpoint did not hold; then stop watching."""
        self.handle.remove()
        frozen, trainable = self.unloaded(backbone)
        pretrained = trainable if self.checkpoints else []
        state, params = backbone.state_dict(), dict(backbone.named_parameters())
        loaded_by = (f'init_cfg Pretrained {self.checkpoints[0]}' if self.checkpoints
                     else 'no init_cfg Pretrained, load_from or resume')
        if frozen:
            count = sum(state[k].numel() for k in frozen if k in params)
            causes = [text for text, on in ((f'frozen_stages={backbone.frozen_stages}', backbone.frozen_stages >= 0),
                                            ('norm_eval=True', backbone.norm_eval),
                                            ('norm_cfg.requires_grad=False',
                                             not backbone.norm_cfg.get('requires_grad', True))) if on]
            raise ConfigError(
                f'model.backbone ({self.name}): {", ".join(causes)} freeze {len(frozen)} tensors '
                f'({count / 1e6:.2f}M parameters) at their random initialisation, which {loaded_by} loaded '
                f'(first: {frozen[0]}; {summary(frozen)}); to train from scratch set frozen_stages=-1, '
                "norm_eval=False and norm_cfg=dict(type='BN', requires_grad=True), else load a checkpoint of "
                'this backbone (docs/detection.md, "Swapping into your own config")')
        if pretrained:
            count = sum(state[k].numel() for k in pretrained if k in params)
            print_log(
                f'aa_det: model.backbone ({self.name}): {loaded_by} left {len(pretrained)} tensors '
                f'({count / 1e6:.2f}M of {sum(p.numel() for p in params.values()) / 1e6:.2f}M parameters) at their '
                'initialisation, to be '
                f'trained from scratch: {summary(pretrained)} (a checkpoint of another architecture, e.g. a '
                "ResNet's? docs/detection.md, \"Swapping into your own config\")", logger='current', level=30)
