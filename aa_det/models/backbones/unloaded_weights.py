"""What a backbone would train from other than the config says: weights nothing
loaded.

mmengine loads a ``Pretrained`` checkpoint with ``strict=False``: a ResNet-50
checkpoint in an AA-ResNet-50 leaves every attention weight and the reshaped
3x3 convs at their initialisation, and an mmpretrain classifier's checkpoint
without ``prefix='backbone.'`` loads nothing at all, with only
``The model and loaded state dict do not match exactly`` among hundreds of log
lines. And mmdet's own configs freeze the stem and stage 1
(``frozen_stages=1``) and every BatchNorm (``norm_eval=True``), which from
scratch freezes random values for the whole run.

:class:`UnloadedWeights` watches every load into the backbone (a
``load_state_dict`` pre-hook: mmengine's ``Pretrained`` init, ``load_from``,
``resume`` and torch's own ``load_state_dict`` all run it) from the start of
its ``init_weights``, and tells what nothing loaded:

* frozen tensors (``frozen_stages``, ``norm_eval``,
  ``norm_cfg.requires_grad=False``) that nothing loaded can never train:
  :meth:`UnloadedWeights.frozen_message`. The backbone's first ``train()`` logs
  it as a warning (``nn.Module.train`` never raises: code that builds a model
  and loads weights later keeps working); the hooks our configs name refuse it
  before the first iteration (:func:`refuse_frozen_unloaded`, from
  ``CheckpointCheckHook``).
* tensors a ``Pretrained`` checkpoint did not hold (with their shape) train
  from scratch, which may be meant (ImageNet convs, new attention): a warning
  with their count and kinds at the first ``train()``.

Both name the key prefix (``prefix='backbone.'``) under which a checkpoint held
the backbone's keys when ``init_cfg`` did not name it.
"""
import re
from collections import Counter
from typing import List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from torch.nn.modules.batchnorm import _BatchNorm

from ...utils.errors import ConfigError

#: the docs' section on the settings a swap must change
SWAP_DOCS = 'docs/detection.md, "Swapping into your own config"'


def _pretrained_checkpoints(init_cfg) -> List[str]:
    """The checkpoints of the ``Pretrained`` entries of an ``init_cfg`` (a
    dict, a list or None)."""
    cfgs = init_cfg if isinstance(init_cfg,
                                  (list,
                                   tuple)) else [init_cfg] if init_cfg else []
    return [
        str(cfg.get('checkpoint')) for cfg in cfgs
        if isinstance(cfg, dict) and getattr(
            cfg.get('type'), '__name__', cfg.get('type')) in ('Pretrained',
                                                              'PretrainedInit')
    ]


def summary(names: List[str], limit: int = 4) -> str:
    """``names`` grouped by their name inside a block
    (``layer2.0.conv2.qkv.weight`` -> ``conv2.qkv.weight``), most frequent
    first: ``'conv2.qkv.weight x4, conv2.proj.weight x4, ...'``."""
    counts = Counter(re.sub(r'^layer\d+\.\d+\.', '', name) for name in names)
    shown = ', '.join(f'{name} x{n}' if n > 1 else name
                      for name, n in counts.most_common(limit))
    others = len(counts) - limit
    return shown + (f', and {others} other kind{"s" if others > 1 else ""}'
                    if others > 0 else '')


class UnloadedWeights:
    """The parameters and BatchNorm statistics of one backbone that no load has
    filled since ``init_weights`` began; see the module's docstring.

    Args:
        backbone (nn.Module): an mmdet ``ResNet`` (``frozen_stages``,
            ``norm_eval``, ``norm_cfg``, ``init_cfg``).
    """

    def __init__(self, backbone: nn.Module) -> None:
        self.name = type(backbone).__name__
        self.checkpoints = _pretrained_checkpoints(backbone.init_cfg)
        self.shapes = {k: v.shape for k, v in backbone.state_dict().items()}
        self.loaded = set()
        # key prefix -> tensors a load held under it and not where they belong
        self.prefixes = Counter()
        self.handle = backbone._register_load_state_dict_pre_hook(self.record)

    def _fits(self, state_dict: dict, key: str, own: str) -> bool:
        return getattr(state_dict[key], 'shape', None) == self.shapes[own]

    def record(self, state_dict, prefix, *args) -> None:
        """``load_state_dict`` pre-hook of the backbone: the keys the incoming
        state holds with their shape, and those it holds under another prefix
        (``backbone.conv1.weight`` for ``conv1.weight``)."""
        found = {
            k
            for k in self.shapes if prefix +
            k in state_dict and self._fits(state_dict, prefix + k, k)
        }
        self.loaded.update(found)
        shifted = Counter()
        for key in state_dict:
            rest = key[len(prefix):] if key.startswith(prefix) else None
            for cut in [i + 1 for i, c in enumerate(rest or '') if c == '.']:
                if rest[cut:] in self.shapes and self._fits(
                        state_dict, key, rest[cut:]):
                    shifted[rest[:cut]] += 1
                    break
        best = shifted.most_common(1)
        if best and best[0][1] > len(found):
            self.prefixes[best[0][0]] += best[0][1]

    def stop(self) -> None:
        """Stop watching the loads."""
        self.handle.remove()

    def unloaded(self, backbone: nn.Module) -> Tuple[List[str], List[str]]:
        """``(frozen, trainable)``: the names of the parameters and BatchNorm
        statistics nothing loaded, those a run keeps as they are and the
        others."""
        params = dict(backbone.named_parameters())
        norms = [(name, m) for name, m in backbone.named_modules()
                 if isinstance(m, _BatchNorm)]
        stats = {
            f'{name}.{key}'
            for name, m in norms for key in ('running_mean', 'running_var')
        }
        norm_keys = stats | {
            f'{name}.{key}'
            for name, m in norms for key in ('weight', 'bias')
        }
        unloaded = [
            k for k in self.shapes
            if (k in params or k in stats) and k not in self.loaded
        ]
        frozen = [
            k for k in unloaded
            if (k in params and not params[k].requires_grad) or (
                backbone.norm_eval and k in norm_keys)
        ]
        return frozen, [k for k in unloaded if k in params and k not in frozen]

    def _source(self) -> str:
        return (f'init_cfg Pretrained {self.checkpoints[0]}'
                if self.checkpoints else 'a '
                'state '
                'dict '
                'loaded')

    def _prefix(self) -> Optional[Tuple[str, str]]:
        """``(where, fix)`` when the loads held the backbone's keys under
        another key prefix, else None."""
        if not self.prefixes:
            return None
        prefix = self.prefixes.most_common(1)[0][0]
        whose = (" (an mmpretrain classifier's keys)"
                 if prefix == 'backbone.' else '')
        return (f'{self._source()} holds them under the key prefix '
                f'{prefix!r}{whose}, which init_cfg does not strip',
                f'add prefix={prefix!r} to init_cfg')

    def frozen_message(self, backbone: nn.Module) -> Optional[str]:
        """One line on the frozen tensors nothing loaded (they can never
        train), or None."""
        frozen, _ = self.unloaded(backbone)
        if not frozen:
            return None
        params = dict(backbone.named_parameters())
        count = sum(params[k].numel() for k in frozen if k in params)
        causes = [
            text for text, on in (
                (f'frozen_stages={backbone.frozen_stages}',
                 backbone.frozen_stages >= 0), ('norm_eval=True',
                                                backbone.norm_eval),
                ('norm_cfg.requires_grad=False',
                 not backbone.norm_cfg.get('requires_grad', True))) if on
        ]
        where, fix = (
            self._prefix() or
            (f'{self._source()} did not hold them' if self.checkpoints else
             'no init_cfg Pretrained, load_from or resume loaded them',
             "to train from scratch set frozen_stages=-1, norm_eval=False and "
             "norm_cfg=dict(type='BN', "
             'requires_grad=True), else load a checkpoint of this backbone'))
        return ((
            f'model.backbone ({self.name}): {", ".join(causes)} freeze '
            f'{len(frozen)} tensors ({count / 1e6:.2f}M parameters) at their '
            f'random initialisation: {where} (first: {frozen[0]}; '
            f'{summary(frozen)}); {fix} ({SWAP_DOCS})'))

    def pretrained_message(self, backbone: nn.Module) -> Optional[str]:
        """One line on the trainable tensors a ``Pretrained`` checkpoint did
        not hold, or None."""
        _, trainable = self.unloaded(backbone)
        if not (self.checkpoints and trainable):
            return None
        params = dict(backbone.named_parameters())
        count = sum(params[k].numel() for k in trainable)
        total = sum(p.numel() for p in params.values())
        prefix = self._prefix()
        cause = (f'{prefix[0]}: {prefix[1]}; ' if prefix else
                 "a checkpoint of another architecture, e.g. a ResNet's? ")
        return ((
            f'model.backbone ({self.name}): {self._source()} left '
            f'{len(trainable)} tensors ({count / 1e6:.2f}M of '
            f'{total / 1e6:.2f}M parameters) at their initialisation, to be '
            f'trained from scratch: {summary(trainable)} '
            f'({cause}{SWAP_DOCS})'))

    def warn(self, backbone: nn.Module) -> None:
        """At the first ``train()`` after ``init_weights``: a warning for each
        of the two messages; then stop watching."""
        self.stop()
        for message in (self.frozen_message(backbone),
                        self.pretrained_message(backbone)):
            if message is not None:
                print_log(f'aa_det: {message}', logger='current', level=30)


def refuse_frozen_unloaded(model: nn.Module) -> None:
    """Raise a :class:`ConfigError` if a backbone in ``model`` that still
    watches its loads has frozen tensors nothing loaded: for a hook, once every
    load of the run is done and before the first iteration."""
    for module in model.modules():
        watcher = module.__dict__.get('_unloaded')
        message = watcher.frozen_message(module) if isinstance(
            watcher, UnloadedWeights) else None
        if message is not None:
            raise ConfigError(message)
