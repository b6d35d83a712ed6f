"""``with_cp`` for mmdet's residual blocks: BatchNorm statistics updated once
per step.

mmdet's ``Bottleneck`` and ``BasicBlock`` call
``torch.utils.checkpoint.checkpoint(_inner_forward, x)``, the reentrant variant
(torch >= 2.4 warns on every call that ``use_reentrant`` is not given). Its
backward runs the block's forward a second time, in training mode, so every
BatchNorm updates its running mean and variance (and ``num_batches_tracked``)
twice per step: with momentum 0.1 the statistics move as with 0.19, and a model
trained with ``with_cp=True`` is not the one trained without it (GSA's own
BatchNorm between its axes too). :class:`BlockCheckpoint` runs the same
recomputation with torch's non-reentrant checkpoint, during which the block's
BatchNorm layers normalise by the batch as before but leave their statistics as
they are (:func:`running_stats_frozen`): outputs, gradients and statistics are
those of the same step without ``with_cp`` (``tests/test_backbones.py``). A
block whose input needs no gradient (after frozen stages) is checkpointed too,
which the reentrant variant cannot do.

Example:
    >>> import torch
    >>> block = PlainBottleneck(64, 16, with_cp=True)
    >>> out = block(torch.rand(2, 64, 8, 8))
    >>> out.shape, int(block.bn1.num_batches_tracked)
    (torch.Size([2, 64, 8, 8]), 1)
    >>> out.sum().backward()  # the forward runs again, the statistics stay
    >>> int(block.bn1.num_batches_tracked)
    1
"""
import functools
from contextlib import contextmanager, nullcontext

import torch
import torch._dynamo
import torch.nn as nn
from mmdet.models.backbones.resnet import BasicBlock, Bottleneck
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

__all__ = [
    'BlockCheckpoint', 'PlainBasicBlock', 'PlainBottleneck',
    'running_stats_frozen'
]


@contextmanager
def running_stats_frozen(module: nn.Module):
    """Within the context the BatchNorm layers of ``module`` that are training
    normalise by the batch's statistics as before and leave their running ones
    as they are: momentum 0 (running ``(1 - 0) * old + 0 * batch``, exactly
    ``old``) and no ``num_batches_tracked`` to count in. They still pass their
    running buffers, so they save the same tensors for the backward as in the
    forward (which torch's non-reentrant checkpoint checks). Layers in eval
    mode (``norm_eval``, frozen stages) update nothing anyway."""
    layers = [
        m for m in module.modules()
        if isinstance(m, _BatchNorm) and m.training and m.track_running_stats
    ]
    saved = [(m.momentum, m.num_batches_tracked) for m in layers]
    for m in layers:
        m.momentum, m.num_batches_tracked = 0.0, None
    try:
        yield
    finally:
        for m, (momentum, count) in zip(layers, saved):
            m.momentum, m.num_batches_tracked = momentum, count


def _contexts(module: nn.Module):
    """``context_fn`` of :func:`torch.utils.checkpoint.checkpoint`: the forward
    as it is, the recomputation with the statistics of ``module``'s BatchNorm
    layers frozen."""
    return nullcontext(), running_stats_frozen(module)


class BlockCheckpoint:
    """Mixin for an mmdet residual block: ``with_cp=True`` recomputes the block
    (its final ReLU included) in the backward by torch's non-reentrant
    checkpoint, BatchNorm statistics updated once. Everything else is the
    block's own ``forward``."""

    def forward(self, x: Tensor) -> Tensor:
        if not (self.with_cp and torch.is_grad_enabled()):
            return super().forward(x)
        return self._checkpointed(x)

    @torch._dynamo.disable
    def _checkpointed(self, x: Tensor) -> Tensor:
        """Eager under ``torch.compile`` too (a graph break): dynamo would take
        the recomputation into its graph only without ``context_fn``, and could
        not with a GSA or AA layer's offset record
        (:class:`~aa_det.models.layers.TrainedOffsetRange`)."""
        return checkpoint(
            self._forward_without_cp,
            x,
            use_reentrant=False,
            context_fn=functools.partial(_contexts, self))

    def _forward_without_cp(self, x: Tensor) -> Tensor:
        """The block's ``forward`` with its own checkpointing off (mmdet reads
        ``with_cp``)."""
        self.with_cp = False
        try:
            return super().forward(x)
        finally:
            self.with_cp = True


class PlainBottleneck(BlockCheckpoint, Bottleneck):
    """mmdet's ``Bottleneck`` with :class:`BlockCheckpoint`'s ``with_cp``: the
    blocks of an attention backbone's stages without attention."""


class PlainBasicBlock(BlockCheckpoint, BasicBlock):
    """mmdet's ``BasicBlock`` with :class:`BlockCheckpoint`'s ``with_cp``."""
