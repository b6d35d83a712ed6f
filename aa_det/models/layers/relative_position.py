"""Relative positions shared by AA and GSA: offsets clipped to a table, the table read at every pair of an
axis, and the tables' initialisation.

Bello et al. (AA, ICCV 2019) Sec. 3.2 and Shen et al. (GSA) eq. (5)-(7): one learned embedding per relative
offset along each axis; tables of ``2 * max_dist - 1`` rows clip larger offsets to the ends (Shaw et al., 2018).

Example:
    >>> import torch
    >>> relative_index(3, 2)
    tensor([[1, 2, 2],
            [0, 1, 2],
            [0, 0, 1]])
    >>> relative_embeddings(torch.zeros(3, 4), 5).shape
    torch.Size([5, 5, 4])
"""
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .kernel_policy import size_constant

__all__ = ['relative_index', 'relative_embeddings', 'init_relative_table']


def relative_index(length: int, max_dist: int, device=None) -> Tensor:
    """Index into a ``2 * max_dist - 1`` row table for every (query, key) pair.

    Returns:
        Tensor: ``[length, length]`` long, ``idx[a, b] = clip(b - a) + max_dist - 1``.
    """
    pos = torch.arange(length, device=device)
    offset, limit = pos[None, :] - pos[:, None], max_dist - 1  # [length, length]: b - a
    # torch.where, not clamp: inductor makes a clamp of an arange sympy Min / Max in a concatenation's index, which
    # it cannot compare where it lowers the concatenation pointwise (GPUs; docs/design.md "Compiling and exporting")
    return torch.where(offset > limit, limit, torch.where(offset < -limit, -limit, offset)) + limit


def relative_embeddings(table: Tensor, length: int) -> Tensor:
    """The table read at every (query, key) pair of an axis, in one gather (``F.embedding``) through
    :func:`relative_index`'s clipped offsets (a cached :func:`size_constant`).

    Args:
        table (Tensor): ``[2M - 1, d]``.
        length (int): ``L``.

    Returns:
        Tensor: ``[L, L, d]``, ``emb[a, b] = table[clip(b - a) + M - 1]``.
    """
    M = (table.shape[0] + 1) // 2
    return F.embedding(size_constant(relative_index, length, M, table.device), table)


def init_relative_table(table: Tensor, head_dim: int) -> Tensor:
    """Initialise a relative table with N(0, head_dim ** -0.5) (AA paper, Sec. 3.2)."""
    with torch.no_grad():
        return table.normal_(0.0, math.pow(head_dim, -0.5))
