"""BatchNorm statistics at test time (``bn_check.py``): how far each
BatchNorm's running statistics are from the batch statistics it sees.

A BatchNorm normalises with its batch's statistics in training and with its
running averages in eval mode. Where one BatchNorm is applied to several FPN
levels (mmdet's ``RetinaHead`` given a BN ``norm_cfg``), its running averages
mix the levels' distributions and normalise none of them as training did: the
detector's eval-mode mAP falls far below what its weights reach
(docs/detection.md, "BatchNorm in the head").

``aa_det.engine.HeadNormCheckHook`` warns of such BatchNorms when a run
starts. Here:

* :class:`RunningStatisticsGap` records, per BatchNorm, how its running
  statistics would shift and scale the inputs it sees;
* :func:`batch_statistics` makes every BatchNorm normalise with its batch's
  statistics, without changing its running statistics
  (``tools/analysis_tools/bn_check.py`` evaluates both ways).

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1),
    ...                             torch.nn.BatchNorm2d(4)).eval()
    >>> with RunningStatisticsGap(model) as gap, torch.no_grad():
    ...     _ = model(torch.randn(2, 3, 8, 8))
    >>> [(name, calls) for name, calls, mean, scale in gap.table()]
    [('1', 1)]
    >>> with batch_statistics(model): model(torch.randn(2, 3, 8, 8)).mean(
    ...     dim=(0, 2, 3)).abs().max() < 1e-5
    tensor(True)
"""
import contextlib
import math
from typing import Dict, Iterator, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def _batchnorms(model: nn.Module) -> Iterator[Tuple[str, _BatchNorm]]:
    return ((name, m) for name, m in model.named_modules()
            if isinstance(m, _BatchNorm))


def _input_statistics(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (biased) variance of a BatchNorm input
    ``[N, C, ...]``, in float32."""
    dims = [d for d in range(x.dim()) if d != 1]
    var, mean = torch.var_mean(x.float(), dim=dims, unbiased=False)
    return mean, var


class RunningStatisticsGap(contextlib.AbstractContextManager):
    """Records, for every BatchNorm of a model, what its running statistics do
    to the inputs it sees.

    Normalised with its running statistics, an input whose channels have batch
    mean ``m`` and variance ``v`` comes out with mean
    ``(m - running_mean) / sqrt(running_var + eps)`` and standard deviation
    ``sqrt((v + eps) / (running_var + eps))`` (before the affine), where
    training gave 0 and 1. Per call, the root mean square of that mean over
    channels, and that of the standard deviation's natural logarithm, are
    recorded; :meth:`table` averages them over the calls.

    Args:
        model (nn.Module): the model whose BatchNorms are watched while the
            context is open.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        # name -> [calls, sum of mean RMS, sum of log-std RMS]
        self._sums: Dict[str, List[float]] = {}
        self._handles = []

    def __enter__(self):
        for name, m in _batchnorms(self.model):
            if m.running_mean is not None:
                self._sums[name] = [0, 0.0, 0.0]
                self._handles.append(
                    m.register_forward_hook(self._record(name)))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False

    def _record(self, name):

        def hook(module, args, output):
            mean, var = _input_statistics(args[0].detach())
            running_var = module.running_var.float() + module.eps
            shift = (mean - module.running_mean.float()) / running_var.sqrt()
            log_scale = 0.5 * torch.log((var + module.eps) / running_var)
            sums = self._sums[name]
            sums[0] += 1
            sums[1] += shift.square().mean().sqrt().item()
            sums[2] += log_scale.square().mean().sqrt().item()

        return hook

    def table(self) -> List[Tuple[str, int, float, float]]:
        """``(name, calls, mean, scale)`` per BatchNorm that ran, furthest
        first: ``mean`` is the average RMS over channels of the normalised
        input's mean (0 when the running mean fits), ``scale`` the factor
        ``exp(RMS of log std)`` by which its standard deviation is off (1 when
        the running variance fits). They are sorted by ``mean +
        log(scale)``."""
        rows = [(name, int(calls), total_shift / calls,
                 math.exp(total_log / calls))
                for name, (calls, total_shift,
                           total_log) in self._sums.items() if calls]
        return sorted(
            rows, key=lambda row: row[2] + math.log(row[3]), reverse=True)


@contextlib.contextmanager
def batch_statistics(model: nn.Module):
    """While open, every BatchNorm of ``model`` normalises with the statistics
    of the batch it is given (per channel, over the batch and positions), in
    any mode, and updates no running statistic. An input with one value per
    channel (a 1x1 map of one image) keeps the running statistics.

    Args:
        model (nn.Module): the model whose BatchNorms switch.
    """

    def batch_forward(module):

        def forward(x):
            if x.numel() // x.shape[1] <= 1:
                return type(module).forward(module, x)
            return F.batch_norm(x, None, None, module.weight, module.bias,
                                True, 0.0, module.eps)

        return forward

    norms = [m for _, m in _batchnorms(model)]
    for m in norms:
        m.forward = batch_forward(m)
    try:
        yield model
    finally:
        for m in norms:
            del m.forward
