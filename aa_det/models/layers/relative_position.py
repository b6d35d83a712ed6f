"""Relative positions shared by AA and GSA: offsets clipped to a table, the
table read at every pair of an axis, the tables' initialisation, and the
offsets that training reached.

Bello et al. (AA, ICCV 2019) Sec. 3.2 and Shen et al. (GSA) eq. (5)-(7): one
learned embedding per relative offset along each axis; tables of
``2 * max_dist - 1`` rows clip larger offsets to the ends (Shaw et al., 2018).
A table trains only the rows of offsets that occur in training:
:class:`TrainedOffsetRange` records, per axis, the largest offset a learning
pass used (saved in ``state_dict``) and crops a table to those rows, so test
maps clip larger offsets to the largest trained one (docs/design.md, "Relative
embeddings at any size").

Example:
    >>> import torch
    >>> # offsets -1, 0, 1 are rows 0, 1, 2
    >>> emb, = relative_embeddings([torch.arange(3.)[:, None]], [3])
    >>> emb[..., 0]
    tensor([[1., 2., 2.],
            [0., 1., 2.],
            [0., 0., 1.]])
    >>> # two tables, two axes, one gather
    >>> [e.shape for e in relative_embeddings([torch.zeros(3, 4)] * 2,
    ...                                       [5, 2])]
    [torch.Size([5, 5, 4]), torch.Size([2, 2, 4])]
    >>> rng, table = TrainedOffsetRange(max_rel_dist=64), torch.zeros(
    ...     127, 8, requires_grad=True)
    >>> # nothing recorded yet: the whole table
    >>> rng.eval().crop(table, 0).shape
    torch.Size([127, 8])
    >>> # a 10-long training map: recorded
    >>> rng.train().crop(table, 0, length=10).shape
    torch.Size([127, 8])
    >>> # at test time: offsets clip at 9
    >>> rng.eval().crop(table, 0, length=30).shape
    torch.Size([19, 8])
    >>> # a 4-long map reads offsets up to 3
    >>> rng.crop(table, 0, length=4).shape
    torch.Size([7, 8])
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
from mmengine.model import BaseModule
from torch import Tensor

from ...utils.compat import is_capturing_graph

__all__ = [
    'offset_index', 'relative_embeddings', 'reset_relative_tables',
    'TrainedOffsetRange'
]

#: :func:`offset_index` of the axes met in eager mode, by ``(axes, device)``
_OFFSET_INDEX = {}


def offset_index(axes: Tuple[Tuple[int, int], ...],
                 device: torch.device) -> Tensor:
    """The row of a concatenation of tables (``2M - 1`` rows each) that each
    (query, key) pair of each axis reads, flattened: ``[sum L^2]``; for an axis
    of length ``L`` and a table of ``2M - 1`` rows, ``clip(b - a) + M - 1``
    plus the rows of the tables before. Computed once per ``axes`` (``(L, M)``
    pairs) in eager mode (four kernels fewer per call and axis); in a captured
    graph, where the lengths may be symbolic, computed in the graph."""
    if is_capturing_graph():
        return _offset_index(axes, device)
    key = (axes, device)
    if key not in _OFFSET_INDEX:
        # a tensor autograd may save (index_select's backward)
        with torch.inference_mode(False):
            _OFFSET_INDEX[key] = _offset_index(axes, device)
    return _OFFSET_INDEX[key]


def _offset_index(axes, device):
    rows, index = 0, []
    for length, M in axes:
        pos = torch.arange(length, device=device)
        # b - a, clipped, as a row of this axis' table
        index.append(((pos[None, :] - pos[:, None]).clamp(1 - M, M - 1) + M -
                      1 + rows).flatten())
        rows += 2 * M - 1
    return index[0] if len(index) == 1 else torch.cat(index)


def relative_embeddings(tables: Sequence[Tensor],
                        lengths: Sequence[int],
                        dtype: Optional[torch.dtype] = None) -> List[Tensor]:
    """Each table read at every (query, key) pair of its axis at the pair's
    offset, clipped to the table; all tables in one gather (``index_select``
    of their concatenation, its gradient one ``index_add_``) and one cast.

    Args:
        tables (Sequence[Tensor]): ``[2M - 1, d]`` each, of one dtype, the
            gather's (and its gradient's sum).
        lengths (Sequence[int]): ``L`` of each table's axis.
        dtype (torch.dtype, optional): of the results. Defaults to the
            tables'.

    Returns:
        list[Tensor]: ``[L, L, d]`` each, ``emb[a, b] = table[clip(b - a) + M -
        1]``.
    """
    axes = tuple((length, (table.shape[0] + 1) // 2)
                 for table, length in zip(tables, lengths))
    table = tables[0] if len(tables) == 1 else torch.cat(list(tables))
    emb = table.index_select(0, offset_index(axes, table.device))
    emb = emb.to(dtype or emb.dtype).split([L * L for L in lengths])
    return [e.view(L, L, -1) for e, L in zip(emb, lengths)]


def reset_relative_tables(layer: torch.nn.Module, *names: str) -> None:
    """``layer``'s relative tables ``names`` (those it has) ~ N(0, dkh^-0.5),
    shared by the heads (AA paper, Sec. 3.2), and its ``offset_range`` (if any)
    to nothing trained: AA's and GSA's construction and init_weights."""
    with torch.no_grad():
        for name in names:
            if hasattr(layer, name):
                getattr(layer, name).normal_(0.0,
                                             math.pow(layer.head_dim, -0.5))
    if hasattr(layer, 'offset_range'):
        layer.offset_range.reset()


class TrainedOffsetRange(BaseModule):
    """Per-axis record (AA: height, width; GSA: column, row) of the largest
    offset used while the tables learned.

    The record is a list of Python ints (no device synchronisation), saved
    through ``get_extra_state``; ``-1`` means nothing recorded (the whole table
    is used). While a graph is captured, nothing depends on the map's length: a
    learning pass records into a non-persistent buffer (an in-graph
    ``clamp_``), which :meth:`train` ``(False)`` and ``state_dict`` fold into
    the integers.

    Args:
        max_rel_dist (int): the tables cover offsets up to
            ``max_rel_dist - 1``.
    """

    def __init__(self, max_rel_dist: int):
        super().__init__()
        self.max_rel_dist = max_rel_dist
        self.trained = [-1, -1]
        self.register_buffer(
            'graph_record', torch.full((2, ), -1), persistent=False)
        self.graph_recorded = False

    def reset(self):
        """Nothing trained (a freshly initialised table)."""
        self.trained = [-1] * len(self.trained)
        self.graph_record.fill_(-1)
        self.graph_recorded = False

    def merge_graph_record(self):
        """Fold what captured graphs recorded into :attr:`trained` (reads the
        buffer once)."""
        if self.graph_recorded:
            self.trained = [
                max(a, b)
                for a, b in zip(self.trained, self.graph_record.tolist())
            ]
            self.graph_recorded = False

    def train(self, mode: bool = True):
        if not mode:
            self.merge_graph_record()
        return super().train(mode)

    def learns(self, table: Tensor) -> bool:
        """``table`` learns in this pass: training mode, grad enabled,
        ``table.requires_grad``."""
        return self.training and torch.is_grad_enabled(
        ) and table.requires_grad

    def crop(self,
             table: Tensor,
             axis: int,
             length: Optional[int] = None) -> Tensor:
        """The rows of ``table`` that the recorded range allows, and that a map
        of ``length`` reads.

        Args:
            table (Tensor): ``[2M - 1, d]`` relative embeddings of ``axis``;
                where it :meth:`learns`, ``length`` widens the record first.
            axis (int): which record.
            length (int, optional): the map's length along ``axis``; needed
                when learning.

        Returns:
            Tensor: in a learning pass the whole table; otherwise
            ``[2m - 1, d]``, ``m = min(M, trained + 1, length)``, a view of the
            middle rows; without a record ``m = min(M, length)``.
        """
        # in a graph nothing depends on ``length``: no guard
        M, in_graph = self.max_rel_dist, is_capturing_graph()
        # the map reads offsets up to length - 1 only: every kernel cuts what
        # it reads
        if self.learns(table):
            if in_graph:  # a tensor record, no size baked in
                self.graph_record[axis].clamp_(min=length - 1)
                self.graph_recorded = True
            else:
                self.trained[axis] = max(self.trained[axis], length - 1)
            return table
        m = M if self.trained[axis] < 0 else min(M, self.trained[axis] + 1)
        if length is not None and not in_graph:
            m = min(m, length)
        return table[M - m:M + m - 1]

    def get_extra_state(self) -> Tensor:
        self.merge_graph_record()
        return torch.tensor(self.trained, dtype=torch.long)

    def set_extra_state(self, state: Tensor):
        self.trained = [int(v) for v in state.tolist()]

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        """A checkpoint without a record (older than it) loads as 'nothing
        recorded'."""
        key = prefix + '_extra_state'  # nn.Module's key for get_extra_state
        if key not in state_dict:
            self.reset()
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if key in missing_keys:
            missing_keys.remove(key)

    def extra_repr(self) -> str:
        return f'max_rel_dist={self.max_rel_dist}, trained={self.trained}'
