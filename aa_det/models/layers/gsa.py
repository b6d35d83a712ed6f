"""Global self-attention module.

Shen et al., *Global Self-Attention Networks for Image Recognition* (ICLR 2021
submission), Sec. 3 and appendix B. Output = content attention (eq. (1),
appendix eq. (4)) + positional attention: column-only attention with relative
embeddings as keys (eq. (2), (5)-(7)), then batch norm, then row-only attention
on its output. Tests compare both with the float64 loops of
``tests/kernel_references.py``.

Example:
    >>> import torch
    >>> gsa = GlobalSelfAttention2d(64, 64)
    >>> gsa(torch.rand(2, 64, 9, 13)).shape
    torch.Size([2, 64, 9, 13])
    >>> GlobalSelfAttention2d(64, 64, stride=2)(torch.rand(2, 64, 9, 13)).shape
    torch.Size([2, 64, 5, 7])
"""
import numbers
from contextlib import nullcontext
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import Tensor

from ...utils.compat import autocast_dtype, is_capturing_graph
from .device_policy import device_policy
from .relative_position import (TrainedOffsetRange, relative_embeddings,
                                reset_relative_tables)

__all__ = [
    'GlobalSelfAttention2d', 'content_attention', 'column_attention',
    'compute_dtype', 'GSA_COMPONENTS', 'AXIAL_SCALES'
]

GSA_COMPONENTS = ('content', 'column', 'row')
# GlobalSelfAttention2d's axial_scale
AXIAL_SCALES = ('trained', 'sum', 'mean')


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype GSA's products compute in for inputs of ``dtype`` on
    ``device``.

    No softmax bounds GSA's outputs, which can leave float16's range, so
    float16 computes in bfloat16 where the device has it, else in float32
    (:mod:`.device_policy`); other dtypes as they are.
    """
    return device_policy(
        device).gsa_float16_dtype if dtype == torch.float16 else dtype


def content_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``Q (softmax_positions(K)^T V)`` per head, linear in HW (eq. (1), (4)).

    Args:
        q, k (Tensor): ``[B, Nh, dkh, H, W]``; v (Tensor):
        ``[B, Nh, dvh, H, W]``.

    Returns:
        Tensor: ``[B, Nh, dvh, H, W]``.
    """
    # [B, Nh, dkh, dvh]
    context = torch.einsum('bnkp,bnvp->bnkv',
                           k.flatten(-2).softmax(-1), v.flatten(-2))
    return torch.einsum('bnkv,bnkxy->bnvxy', context, q)


def axial_layout(q: Tensor) -> Tensor:
    """``q`` ``[B, Nh, dkh, H, W]`` copied into the memory order
    ``[H, W, B, Nh, dkh]`` (same shape, a permuted view): the layout content
    attention and column attention both read without a copy of their own."""
    return q.permute(3, 4, 0, 1, 2).contiguous().permute(2, 3, 4, 0, 1)


def _queries_by_row(q: Tensor) -> Tensor:
    """The queries ``[B, Nh, dkh, H, w]`` batched over their row:
    ``[H (x), G, dkh]``, ``G = w * B * Nh`` columns (a view of
    :func:`axial_layout`'s)."""
    return q.permute(3, 4, 0, 1, 2).reshape(q.shape[3], -1, q.shape[2])


def _to_columns(maps: Tensor) -> Tensor:
    """Maps ``[B, Nh, d, H, w]`` as columns ``[G, d, H]``, ``G = w * B * Nh``;
    :func:`_to_maps` undoes it."""
    return maps.permute(4, 0, 1, 2, 3).flatten(0, 2)


def _to_maps(cols: Tensor, like: Tensor) -> Tensor:
    """Columns ``[G, d, H]`` as maps ``[B, Nh, d, H, w]``, ``B, Nh, H, w``
    those of ``like``."""
    B, Nh, _, H, w = like.shape
    return cols.view(w, B, Nh, -1, H).permute(1, 2, 3, 4, 0)


def _columns(qc: Tensor, vc: Tensor, emb: Tensor) -> Tensor:
    """Column attention of columns: queries ``qc`` ``[H (x), G, dkh]``
    (:func:`_queries_by_row`), values ``vc`` ``[G, dvh, H (i)]``
    (:func:`_to_columns`) and ``emb`` ``[H (x), H (i), dkh]``, all of one
    dtype: ``[G, dvh, H (x)]``."""
    # [H (x), G, H (i)]: q[x] . R[i - x]
    logits = torch.bmm(qc, emb.transpose(1, 2))
    return torch.bmm(vc, logits.permute(1, 2, 0))


def _column_grads(qc: Tensor, vc: Tensor, emb: Tensor, grad: Tensor):
    """Gradients of :func:`_columns` (its two GEMMs' four, the logits
    recomputed) for the gradient ``grad`` ``[G, dvh, H (x)]`` of its output:
    ``dqc`` ``[H (x), G, dkh]``, ``dvc`` ``[G, dvh, H (i)]`` and ``demb``
    ``[H (x), H (i), dkh]``, in ``qc``'s dtype."""
    logits = torch.bmm(qc, emb.transpose(1, 2))  # [H (x), G, H (i)]
    # [H (x), G, H (i)]
    grad_logits = torch.bmm(grad.transpose(1, 2), vc).transpose(0, 1)
    dvc = torch.bmm(grad, logits.transpose(0, 1))
    dqc = torch.bmm(grad_logits, emb)
    return dqc, dvc, torch.bmm(grad_logits.transpose(1, 2), qc)


class _ChunkedColumns(torch.autograd.Function):
    """:func:`_columns` per chunk of ``step`` columns. The forward keeps no
    logits; the backward recomputes each chunk's logits and takes the gradients
    of its two GEMMs, so both passes hold one chunk of logits. This is the
    kernel's own backward, as a fused attention kernel's (the logits,
    ``H / dkh`` times the layer's maps, are never kept whole), not a
    recomputation of the layer (docs/design.md, "Axial kernel", measures both).

    The values are copied once into columns, which the backward keeps in place
    of the maps they came from (the same size; the qkv conv's output is then
    kept by nobody). With several chunks, the queries and the incoming
    gradient are copied per chunk, and outputs and gradients written into
    whole tensors: no small tensor outlives its chunk, where it would fragment
    the CPU allocator's heap. One chunk (a GPU's, :mod:`.device_policy`) is
    returned as it is computed.
    """

    @staticmethod
    def forward(ctx, q, v, emb, step):
        # [G, dvh, H (i)], G = (w, B, Nh): a chunk of columns is a run of G
        vc = _to_columns(v)
        ctx.save_for_backward(q, vc, emb)
        ctx.step = step
        W, per_column = q.shape[-1], q.shape[0] * q.shape[1]
        if step >= W:
            return _to_maps(_columns(_queries_by_row(q), vc, emb), v)
        out = vc.new_empty(vc.shape)  # [G, dvh, H (x)]
        for s in range(0, W, step):
            g = slice(s * per_column, (s + step) * per_column)
            out[g] = _columns(_queries_by_row(q[..., s:s + step]), vc[g], emb)
        return _to_maps(out, v)

    @staticmethod
    def backward(ctx, grad_out):
        q, vc, emb = ctx.saved_tensors  # emb in q's dtype
        step, W, per_column = ctx.step, q.shape[-1], q.shape[0] * q.shape[1]
        # the forward's dtype
        with torch.autocast(q.device.type, enabled=False):
            if step >= W:
                dqc, dvc, demb = _column_grads(
                    _queries_by_row(q), vc, emb, _to_columns(grad_out))
            else:
                # [H (x), G, dkh], [G, dvh, H (i)]
                dqc = q.new_empty(q.shape[3], vc.shape[0], q.shape[2])
                dvc = vc.new_empty(vc.shape)
                demb = torch.zeros_like(
                    emb, dtype=torch.promote_types(emb.dtype, torch.float32))
                for s in range(0, W, step):
                    cols = slice(s, s + step)
                    g = slice(s * per_column, (s + step) * per_column)
                    dqc[:, g], dvc[g], demb_chunk = _column_grads(
                        _queries_by_row(q[..., cols]), vc[g], emb,
                        _to_columns(grad_out[..., cols]))
                    # the chunks summed in float32, rounded to emb's dtype once
                    demb += demb_chunk
                demb = demb.to(emb.dtype)
        # as maps [B, Nh, d, H, w]
        return (_to_maps(dqc.permute(1, 2, 0), q), _to_maps(dvc,
                                                            q), demb, None)


def column_attention(q: Tensor,
                     v: Tensor,
                     emb: Tensor,
                     chunk_logits: Optional[int] = None) -> Tensor:
    """Column-only positional attention, appendix eq. (5)-(7):
    ``out[x, y] = sum_i (q[x, y] . R[i - x]) v[i, y]`` (no softmax, as eq.
    (2)).

    Columns are computed in chunks of at most ``chunk_logits`` logits (at least
    one column), each recomputed in the backward (:class:`_ChunkedColumns`):
    memory linear in HW. While a graph is captured, all at once.

    Args:
        q (Tensor): ``[B, Nh, dkh, H, W]``; v (Tensor): ``[B, Nh, dvh, H, W]``,
            of one dtype.
        emb (Tensor): ``[H (x), H (i), dkh]``, ``R[i - x]``: the relative
            table read at every pair of the column
            (:func:`.relative_embeddings`), in ``q``'s dtype.
        chunk_logits (int, optional): logits per chunk. Defaults to the
            device's (:mod:`.device_policy`).

    Returns:
        Tensor: ``[B, Nh, dvh, H, W]``.
    """
    B, Nh, _, H, W = q.shape
    if is_capturing_graph():
        return _to_maps(_columns(_queries_by_row(q), _to_columns(v), emb), v)
    chunk_logits = chunk_logits or device_policy(q.device).gsa_chunk_logits
    return _ChunkedColumns.apply(q, v, emb,
                                 max(1, chunk_logits // (B * Nh * H * H)))


@MODELS.register_module('GSA')
class GlobalSelfAttention2d(BaseModule):
    """Global self-attention (GSA) module, a drop-in for a 3x3 convolution.

    Has ``nn.Conv2d``'s signature so ``build_conv_layer`` builds it from
    ``dict(type='GSA', ...)``.

    Args:
        in_channels (int): input channels.
        out_channels (int): output (= value) channels.
        kernel_size (int): kernel of the convolution it replaces, odd (the
            attention is global). Defaults to 3.
        padding (int, optional): None or that convolution's 'same' padding,
            ``(kernel_size - 1) // 2``.
        dilation, groups, bias: the neutral values only (1, 1, False); other
        values are refused.
        stride (int): 1, or 2 for a 2x2 average pool (``ceil_mode``) after the
            module (GSA Sec. 4).
        num_heads (int): heads. Defaults to 8.
        key_channels (int, optional): channels of keys and queries. Defaults to
            ``in_channels`` (GSA Sec. 4).
        components (Sequence[str]): any of 'content', 'column', 'row' (GSA
            Table 4). Defaults to all three.
        max_rel_dist (int): relative tables cover offsets up to
            ``max_rel_dist - 1``; larger ones clip (at test time, at the
            largest trained offset: :class:`TrainedOffsetRange`). Defaults
            to 64.
        norm_cfg (dict): norm between the column and row sub-layers. Defaults
            to ``dict(type='BN')``.
        axial_scale (str): how the column and row sums scale with their axis
            length ``L`` (docs/design.md, "GSA off its training conditions"):
            ``'trained'``, eq. (7)'s sums up to the longest trained length
            ``T``, rescaled by ``T / L`` beyond; ``'sum'``, eq. (7)'s sums at
            every size (the paper's form); ``'mean'``, sums divided by ``L`` at
            every size. Defaults to ``'trained'``.
        init_cfg (dict, optional): mmengine init config.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 kernel_size: int = 3,
                 stride: int = 1,
                 padding: Optional[int] = None,
                 dilation: int = 1,
                 groups: int = 1,
                 bias: bool = False,
                 num_heads: int = 8,
                 key_channels: Optional[int] = None,
                 components: Sequence[str] = GSA_COMPONENTS,
                 max_rel_dist: int = 64,
                 norm_cfg: dict = dict(type='BN'),
                 axial_scale: str = 'trained',
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg)
        key_channels = in_channels if key_channels is None else key_channels
        for name, value in (('key_channels', key_channels), ('out_channels',
                                                             out_channels)):
            if value <= 0 or value % num_heads:
                raise ValueError(
                    f'GlobalSelfAttention2d: {name}={value} must be a '
                    f'positive multiple of num_heads={num_heads}')
        components = tuple(components)
        if not components or any(c not in GSA_COMPONENTS for c in components):
            raise ValueError(
                f'GlobalSelfAttention2d: components must be a non-empty '
                f'subset of {GSA_COMPONENTS}, got {components}')
        for name, value, allowed in (('axial_scale', axial_scale,
                                      AXIAL_SCALES), ('stride', stride, (1,
                                                                         2))):
            if value not in allowed:
                raise ValueError(
                    f'GlobalSelfAttention2d: {name} must be one of {allowed}, '
                    f'got {value!r}')
        for name, value, neutral in (('dilation', dilation, 1),
                                     ('groups', groups, 1), ('bias', bias,
                                                             False)):
            if value != neutral:
                raise ValueError(
                    f'GlobalSelfAttention2d: {name}={value!r} is not '
                    f'supported (global attention has no dilation, groups or '
                    f'bias); use {name}={neutral!r}')
        if kernel_size % 2 != 1 or padding not in (None,
                                                   (kernel_size - 1) // 2):
            raise ValueError(
                f"GlobalSelfAttention2d: kernel_size={kernel_size}, "
                f"padding={padding} is not a 'same' convolution's: use an odd "
                f"kernel_size and padding None or {(kernel_size - 1) // 2}")
        # it sizes the tables
        if not isinstance(max_rel_dist, numbers.Integral) or max_rel_dist < 1:
            raise ValueError(
                f'GlobalSelfAttention2d: max_rel_dist must be an int >= 1, '
                f'got {max_rel_dist!r}')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.key_channels, self.num_heads, self.stride = (key_channels,
                                                          num_heads, stride)
        self.head_dim = key_channels // num_heads
        self.components, self.axial_scale = components, axial_scale
        self.qkv = nn.Conv2d(
            in_channels, 2 * key_channels + out_channels, 1, bias=False)
        if 'column' in components:
            self.rel_col = nn.Parameter(
                torch.empty(2 * max_rel_dist - 1, self.head_dim))
        if 'row' in components:
            self.rel_row = nn.Parameter(
                torch.empty(2 * max_rel_dist - 1, self.head_dim))
        if 'column' in components and 'row' in components:
            self.norm_col = build_norm_layer(norm_cfg, out_channels)[1]
        if 'column' in components or 'row' in components:
            # offsets (column, row) trained so far
            self.offset_range = TrainedOffsetRange(max_rel_dist)
        reset_relative_tables(self, 'rel_col', 'rel_row')

    def scale_axial(self, out: Tensor, name: str, length: int) -> Tensor:
        """``out``, the sum of the ``name`` (``'column'`` / ``'row'``)
        sub-layer over a map of ``length`` along its axis, scaled as
        ``axial_scale`` says: ``'trained'`` times ``T / max(T, L)`` with ``T``
        the longest recorded axis (unscaled in a learning pass or without a
        record)."""
        if self.axial_scale == 'sum':
            return out
        if self.axial_scale == 'mean':
            return out * (1 / length)
        # T, 0 without a record
        trained = self.offset_range.trained[0 if name == 'column' else 1] + 1
        if trained < 1 or self.offset_range.learns(self.rel_col if name ==
                                                   'column' else self.rel_row):
            return out
        if torch.jit.is_tracing():  # TorchScript traces the length as a tensor
            return out * (trained / torch.as_tensor(length).clamp(min=trained))
        # symbolic in a captured graph: no size baked in
        return out * (trained / torch.sym_max(trained, length))

    def init_weights(self):
        super().init_weights()
        reset_relative_tables(self, 'rel_col', 'rel_row')

    def axial_embeddings(self, H: int, W: int, dtype: torch.dtype) -> list:
        """The column and row tables (those of :attr:`components`), cropped
        (:class:`TrainedOffsetRange`), read at every pair of their axis in one
        gather: ``[H, H, dkh]``, ``[W, W, dkh]`` in ``dtype``; the gather and
        its gradient's sum in float32 (or float64)."""
        tables, lengths = [], []
        for name, axis, length in (('column', 0, H), ('row', 1, W)):
            if name in self.components:
                table = self.rel_col if axis == 0 else self.rel_row
                tables.append(
                    self.offset_range.crop(table, axis, length).to(
                        torch.promote_types(dtype, torch.float32)))
                lengths.append(length)
        return relative_embeddings(tables, lengths, dtype) if tables else []

    def attention(self, x: Tensor) -> Tensor:
        """Content plus positional attention of ``x`` ``[B, C, H, W]``, before
        the stride's pool: ``[B, out_channels, H, W]``."""
        B, _, H, W = x.shape
        amp = autocast_dtype(x.device.type)
        dtype = compute_dtype(amp or x.dtype, x.device)
        # under float16 autocast the qkv conv runs in bfloat16 already
        # (compute_dtype): nothing overflows float16
        bf16_conv = amp == torch.float16 and dtype == torch.bfloat16
        with torch.autocast(
                x.device.type, dtype=dtype) if bf16_conv else nullcontext():
            q, k, v = self.qkv(x).to(dtype).split(
                [self.key_channels, self.key_channels, self.out_channels], 1)
        shape = (B, self.num_heads, -1, H, W)
        # [B, Nh, d, H, W]
        q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        if 'column' in self.components:
            # one copy each, in layouts that content and column attention
            # both read (v's: the columns the column kernel keeps); the qkv
            # conv's output is then kept by nobody
            q, v = axial_layout(q), _to_maps(_to_columns(v), v)
        with torch.autocast(x.device.type, enabled=False):
            out = content_attention(q, k,
                                    v) if 'content' in self.components else 0
            pos, embs = v, iter(self.axial_embeddings(H, W, q.dtype))
            if 'column' in self.components:
                pos = self.scale_axial(
                    column_attention(q, pos, next(embs)), 'column', H)
                if 'row' in self.components:
                    pos = self.norm_col(pos.reshape(B, -1, H,
                                                    W)).view(pos.shape)
            # column attention of the transposed maps
            if 'row' in self.components:
                pos = column_attention(
                    q.transpose(-1, -2), pos.transpose(-1, -2),
                    next(embs)).transpose(-1, -2)
                pos = self.scale_axial(pos, 'row', W)
            if 'column' in self.components or 'row' in self.components:
                out = out + pos  # [B, Nh, dvh, H, W]
        return out.reshape(B, self.out_channels, H, W)

    def forward(self, x: Tensor) -> Tensor:
        # no recomputation of its own: the block's with_cp decides
        # (docs/design.md, "GSA: the module ...")
        out = self.attention(x)
        return F.avg_pool2d(
            out, 2, 2, ceil_mode=True) if self.stride == 2 else out
