"""The shared frame of AA-ResNet and GSA-ResNet: mmdet's ResNet with attention
stages.

Follows mmdet's ``ResNeSt``: blocks of their own (:mod:`aa_det.models.blocks`)
take an explicit ``attention`` conv config, and
:meth:`AttentionResNet.make_res_layer` hands it to the stages listed in
``stage_with_attention``. mmdet's ``dcn`` / ``stage_with_dcn`` and ``plugins``
stay free and combine with attention. The other stages' blocks are mmdet's,
with the attention blocks' ``with_cp``
(:class:`~aa_det.models.blocks.BlockCheckpoint`: BatchNorm statistics updated
once).

Example:
    >>> import torch
    >>> model = AttentionResNet(depth=18, base_channels=16,
    ...                         attention=dict(type='GSA', num_heads=2),
    ...                         stage_with_attention=(False, False, True,
    ...                                               True))
    >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 64, 96))]
    [(1, 16, 16, 24), (1, 32, 8, 12), (1, 64, 4, 6), (1, 128, 2, 3)]
"""
import inspect
from typing import Optional, Sequence

from mmdet.models.backbones.resnet import BasicBlock, Bottleneck, ResNet
from mmdet.registry import MODELS

from ...utils.errors import refused_global, unsafe_checkpoint_error
from ..blocks import (AttentionBasicBlock, AttentionBottleneck,
                      PlainBasicBlock, PlainBottleneck)
from .unloaded_weights import UnloadedWeights


def init_defaults(cls) -> dict:
    """The default arguments of ``cls.__init__``."""
    return {
        key: p.default
        for key, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


#: mmdet ``ResNet``'s defaults, for the checks of the settings it will use
RESNET_DEFAULTS = init_defaults(ResNet)
#: arguments of a conv layer that the blocks set, never the ``attention``
#: config
CONV_ARGS = ('in_channels', 'out_channels', 'kernel_size', 'stride', 'padding',
             'dilation', 'groups', 'bias')


def check_per_stage(name: str, num_stages: int,
                    **settings: Optional[Sequence]):
    """Refuse ``num_stages`` outside mmdet ResNet's 1..4 and per-stage settings
    of another length.

    Args:
        name (str): the backbone, for the message.
        num_stages (int): the backbone's ``num_stages``.
        **settings: per-stage sequences by argument name; None is skipped.
    """
    if not 1 <= num_stages <= 4:
        raise ValueError(
            f'{name}: num_stages={num_stages} must be 1 to 4 (the stages of '
            f'mmdet\'s ResNet)')
    for key, value in settings.items():
        if value is not None and len(value) != num_stages:
            raise ValueError(
                f'{name}: {key}={tuple(value)} has {len(value)} entries; it '
                f'needs one per stage, num_stages={num_stages}')


def check_attention_keys(name: str,
                         attention: dict,
                         stage_keys: Sequence[str] = ()):
    """Refuse keys of ``attention`` that its layer does not take (or that the
    blocks or the backbone set per stage), naming the keys allowed.

    Args:
        name (str): the backbone, for the message.
        attention (dict): conv-layer config of the attention layer.
        stage_keys (Sequence[str]): keys the backbone sets per stage.
    """
    layer = attention['type']
    layer = MODELS.get(layer) if isinstance(layer, str) else layer
    if layer is None:
        raise ValueError(
            f'{name}: attention type {attention["type"]!r} is not a '
            f'registered conv layer (AAConv, GSA)')
    allowed = sorted(
        set(inspect.signature(layer).parameters) - set(CONV_ARGS) -
        set(stage_keys))
    unknown = sorted(set(attention) - set(allowed) - {'type'})
    if unknown:
        raise ValueError(
            f'{name}: attention key(s) {", ".join(unknown)} not taken by '
            f'{layer.__name__}; allowed: {", ".join(allowed)}')


class AttentionResNet(ResNet):
    """mmdet's ``ResNet`` whose blocks in chosen stages replace a 3x3 conv by
    attention.

    Takes every argument of mmdet's ``ResNet`` (``depth``, ``num_stages``,
    ``out_indices``, ``frozen_stages``, ``norm_cfg``, ``norm_eval``,
    ``with_cp``, ``style``, ``zero_init_residual``, ``dcn``,
    ``stage_with_dcn``, ``plugins``, ``init_cfg``, ...) plus:

    Args:
        attention (dict): conv-layer config of the attention layer
            (``dict(type='AAConv', ...)`` or ``dict(type='GSA', ...)``).
        stage_with_attention (Sequence[bool]): stages whose blocks use it,
            one entry per stage (``num_stages``, 1 to 4).
    """

    #: mmdet's block -> the same block with an attention layer
    attention_blocks = {
        Bottleneck: AttentionBottleneck,
        BasicBlock: AttentionBasicBlock
    }
    #: mmdet's block -> the same block with the attention blocks' ``with_cp``,
    #: in the other stages
    plain_blocks = {Bottleneck: PlainBottleneck, BasicBlock: PlainBasicBlock}
    #: attention-layer arguments :meth:`stage_attention` sets, refused in
    #: ``attention``
    stage_keys = ()

    def __init__(self, depth: int, attention: dict,
                 stage_with_attention: Sequence[bool], **kwargs):
        name = type(self).__name__
        if depth not in self.arch_settings:
            raise KeyError(f'{name}: invalid depth {depth}; choose from '
                           f'{sorted(self.arch_settings)}')
        # what mmdet's ResNet will use
        settings = {**RESNET_DEFAULTS, **kwargs}
        num_stages = settings['num_stages']
        check_per_stage(
            name,
            num_stages,
            stage_with_attention=stage_with_attention,
            strides=settings['strides'],
            dilations=settings['dilations'],
            stage_with_dcn=settings['stage_with_dcn']
            if settings['dcn'] else None)
        if not settings['out_indices'] or max(
                settings['out_indices']) >= num_stages:
            raise ValueError(
                f'{name}: out_indices={tuple(settings["out_indices"])} is '
                f'empty or names a stage past the last '
                f'(num_stages={num_stages}: stages 0 to {num_stages - 1})')
        # mmdet's ResNet: AttributeError 'layer5' in _freeze_stages
        if settings['frozen_stages'] > num_stages:
            raise ValueError(
                f'{name}: frozen_stages={settings["frozen_stages"]} freezes '
                f'more stages than num_stages={num_stages} (-1: none, 0: the '
                f'stem, i: the stem and stages 1 to i)')
        block = self.arch_settings[depth][0]
        unsupported = [
            key for key, used in ((
                'dcn', settings['dcn'] and any(settings['stage_with_dcn'])),
                                  ('plugins', settings['plugins'] is not None))
            if used
        ]
        if block is BasicBlock and unsupported:
            deep = sorted(d for d, (b, _) in self.arch_settings.items()
                          if b is Bottleneck)
            raise ValueError(
                f'{name}: depth={depth} builds basic blocks, which take no '
                f'{" or ".join(unsupported)} (mmdet\'s BasicBlock); use depth '
                f'{", ".join(map(str, deep))} (bottleneck blocks)')
        check_attention_keys(name, attention, self.stage_keys)
        self.attention = dict(attention)
        self.stage_with_attention = tuple(stage_with_attention)
        super().__init__(depth, **kwargs)

    def stage_attention(self, stage: int) -> dict:
        """The attention config of ``stage`` (0-based); subclasses add
        per-stage settings."""
        return dict(self.attention)

    def make_res_layer(self, **kwargs):
        """mmdet's ``ResLayer``; in an attention stage with the attention
        blocks and config."""
        # mmdet's ResNet records each stage's name after building it
        stage = len(self.res_layers)
        if self.stage_with_attention[stage]:
            kwargs['block'] = self.attention_blocks[kwargs['block']]
            kwargs['attention'] = self.stage_attention(stage)
        else:
            kwargs['block'] = self.plain_blocks[kwargs['block']]
        return super().make_res_layer(**kwargs)

    def init_weights(self):
        """mmdet's; from here on the loads into the backbone are watched, for
        what nothing loads (:mod:`.unloaded_weights`). A ``Pretrained``
        checkpoint that torch's safe loading refuses (mmengine's
        ``HistoryBuffer``, written without ``SafeCheckpointHook``) is one line
        naming the converter."""
        # watches the loads from now on
        unloaded = None if self.is_init else UnloadedWeights(self)
        try:
            super().init_weights()
        # torch raises pickle's UnpicklingError, or its own
        except Exception as e:  # noqa: BLE001
            refused = refused_global(e)
            if unloaded is not None:
                unloaded.stop()
            if refused is None:
                raise
            path = ', '.join(
                unloaded.checkpoints
            ) if unloaded and unloaded.checkpoints else 'init_cfg Pretrained'
            raise unsafe_checkpoint_error(path, refused) from None
        if unloaded is not None:
            self._unloaded = unloaded

    def train(self, mode: bool = True):
        """mmdet's (frozen stages, ``norm_eval``). The first time training
        starts after ``init_weights`` (after any ``load_from`` or ``resume``),
        frozen weights that nothing loaded and weights a ``Pretrained``
        checkpoint left at their initialisation are each one warning
        (:mod:`.unloaded_weights`); the hooks our configs name refuse the
        former before the first iteration."""
        super().train(mode)
        unloaded = self.__dict__.get('_unloaded')
        if mode and unloaded is not None:
            self._unloaded = None
            unloaded.warn(self)
