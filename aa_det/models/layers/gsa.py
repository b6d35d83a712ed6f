"""Global self-attention module.

Shen et al., *Global Self-Attention Networks for Image Recognition* (ICLR 2021
submission), Sec. 3 and appendix B. Output = content attention (eq. (1), appendix
eq. (4)) + positional attention (column-only attention with relative embeddings as
keys, eq. (2) and (5)-(7), then batch norm, then row-only attention on its output).

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
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from ...utils.compat import autocast_dtype
from .kernel_policy import axial_chunk_elems, compute_dtype, graph_mode, kernel_device, packed, size_constant
from .relative_position import TrainedOffsetRange, relative_embeddings, relative_index, reset_relative_tables

__all__ = ['GlobalSelfAttention2d', 'content_attention', 'content_context', 'gsa_operands', 'column_attention',
           'row_attention', 'axial_embeddings', 'GSA_COMPONENTS', 'AXIAL_SCALES']

GSA_COMPONENTS = ('content', 'column', 'row')
AXIAL_SCALES = ('trained', 'sum', 'mean')  # GlobalSelfAttention2d's axial_scale
#: Memory orders (permutations of ``[B, Nh, d, H, W]``) of the copies GSA's kernels read without another copy:
#: ``q`` of column / content and of row attention, ``v`` of column / content and (without a column branch) row.
AXIAL_Q, ROW_Q = (3, 4, 0, 1, 2), (4, 3, 0, 1, 2)  # [H, W, B, Nh, dkh], [W, H, B, Nh, dkh]
AXIAL_V, COLUMN_V, ROW_V = AXIAL_Q, (4, 0, 1, 2, 3), (3, 0, 1, 2, 4)  # [H, W, .., dvh], [W, .., dvh, H], [H, .., W]


def content_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``Q (softmax_positions(K)^T V)`` per head, linear in HW (GSA eq. (1), (4)).

    The softmax in float32 (or float64); ``q`` in the layout of :data:`AXIAL_Q`, shared with column attention.

    Args:
        q, k (Tensor): ``[B, Nh, dkh, H, W]``; v (Tensor): ``[B, Nh, dvh, H, W]``.

    Returns:
        Tensor: ``[B, Nh, dvh, H, W]`` (contiguous) in :func:`compute_dtype` of ``v``'s dtype.
    """
    B, Nh, dk, H, W = q.shape
    dtype = compute_dtype(v.dtype, kernel_device(v.device.type))
    with torch.autocast(v.device.type, enabled=False):
        qc = packed(q.permute(AXIAL_Q), dtype).view(H, -1, dk)  # [H, (W, B, Nh), dkh]: one copy at most
        return _content_product(qc, content_context(k, v, dtype)).view(B, Nh, -1, H, W)


def content_context(k: Tensor, v: Tensor, dtype: torch.dtype) -> Tensor:
    """``softmax_positions(K)^T V`` per head, content attention's context that every query reads: ``k``
    ``[B, Nh, dkh, H, W]`` and ``v`` ``[B, Nh, dvh, H, W]`` -> ``[B * Nh, dkh, dvh]`` in ``dtype``
    (:func:`compute_dtype`)."""
    B, Nh, dk = k.shape[:3]
    with torch.autocast(v.device.type, enabled=False):
        k = k.flatten(-2)  # [B, Nh, dkh, HW]
        # in float32 (float64) inside the kernel; fp16 inputs are not rounded to bf16 before it
        k = k.softmax(-1) if k.dtype == dtype else k.softmax(-1, dtype=torch.float32).to(dtype)
        return torch.einsum('bnkp,bnvp->bnkv', k, v.flatten(-2).to(dtype)).reshape(B * Nh, dk, -1)


def _content_queries(qc: Tensor, heads: int) -> Tensor:
    """``[B * Nh, dkh, HW]`` strided view of ``q`` laid out as :data:`AXIAL_Q`, ``[H, (W, B, Nh), dkh]``
    (``heads`` = ``B * Nh``): what content attention's GEMMs read, without a copy."""
    return qc.view(-1, heads, qc.shape[-1]).permute(1, 2, 0)


def _content_product(qc: Tensor, context: Tensor) -> Tensor:
    """Content attention's output ``context^T q``: ``[B * Nh, dvh, HW]``."""
    return torch.bmm(context.transpose(1, 2), _content_queries(qc, context.shape[0]))


def gsa_operands(qkv: Tensor, num_heads: int, sizes: Sequence[int], dtype: torch.dtype,
                 layouts: Sequence[tuple]) -> list:
    """Views and copies of ``q``, ``k`` and ``v`` from the qkv convolution's output.

    Args:
        qkv (Tensor): ``[B, 2 dk + dv, H, W]``: ``q``, ``k``, ``v`` channels of ``sizes``.
        layouts (Sequence[tuple]): ``(part, order)`` per operand: ``part`` 0 (``q``), 1 (``k``) or 2 (``v``);
            ``order`` None for a view, else the memory order of a copy in ``dtype`` (e.g. :data:`AXIAL_Q`),
            a copy always (a view saved for the backward would keep the whole qkv output alive).

    Returns:
        list[Tensor]: ``[B, Nh, d, H, W]`` each, the copies laid out in their ``order``.
    """
    B, _, H, W = qkv.shape
    parts = [t.reshape(B, num_heads, -1, H, W) for t in qkv.split(list(sizes), 1)]
    return [parts[part] if order is None else
            parts[part].permute(order).to(dtype, memory_format=torch.contiguous_format, copy=True)
            .permute([order.index(i) for i in range(5)])
            for part, order in layouts]


def _axial_chunk(q: Tensor, v: Tensor, emb: Tensor) -> Tensor:
    """One chunk of :class:`_AxialRelativeAttention`: ``[L, g, dk]``, ``[g, dv, L]``,
    ``[L, dk, L]`` -> ``[g, dv, L]``."""
    logits = torch.bmm(q, emb)  # [L (x), g, L (i)]: q[g, x] . R[i - x], one GEMM per x
    return torch.bmm(v, logits.permute(1, 2, 0))  # [g, dv, L (x)]


def _axial_chunks(q: Tensor, v: Tensor, emb: Tensor, chunk: int) -> Tensor:
    """:func:`_axial_chunk` over chunks of ``chunk`` sequences: ``[G, dv, L]``."""
    if chunk >= v.shape[0]:
        return _axial_chunk(q, v, emb)
    return torch.cat([_axial_chunk(q[:, s:s + chunk], v[s:s + chunk], emb) for s in range(0, v.shape[0], chunk)])


class _AxialRelativeAttention(torch.autograd.Function):
    """``out[g, :, x] = sum_i (q[x, g] . emb[x, :, i]) v[g, :, i]`` in chunks of at most ``chunk``
    sequences ``g`` (one chunk when ``chunk`` covers them all); with a ``context``, content
    attention's product with the same ``q`` too (:func:`_content_product`).

    Two batched GEMMs per chunk; the backward recomputes the logits chunk by chunk. ``emb``'s gradient is
    accumulated in its own dtype (float32 or float64), never rounded to ``q``'s (docs/design.md, "GSA axial
    positional attention").
    """

    @staticmethod
    def forward(ctx, q, v, emb, chunk, context=None):
        emb_low = emb.to(q.dtype)  # [L, dk, L], cast once for both passes
        ctx.save_for_backward(q, v, emb_low, context)
        ctx.chunk, ctx.emb_dtype = chunk, emb.dtype
        out = _axial_chunks(q, v, emb_low, chunk)  # [G, dv, L]
        return out if context is None else (out, _content_product(q, context))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_content=None):
        with torch.autocast(grad_out.device.type, enabled=False):  # the forward's dtype
            q, v, emb, context = ctx.saved_tensors
            G, chunk = v.shape[0], ctx.chunk
            dqs, dvs, demb = [], [], None
            for s in range(0, G, chunk) if chunk < G else (0,):  # no range over a symbolic G when one chunk
                sl = slice(s, s + chunk)
                qs, vs, gs = (q, v, grad_out) if chunk >= G else (q[:, sl], v[sl], grad_out[sl])
                logits = torch.bmm(qs, emb)  # [L (x), g, L (i)]
                dvs.append(torch.bmm(gs, logits.transpose(0, 1)))  # [g, dv, L (i)]
                dlogits = torch.bmm(gs.transpose(1, 2), vs).transpose(0, 1)  # [L (x), g, L (i)]
                dqs.append(torch.bmm(dlogits, emb.transpose(1, 2)))  # [L, g, dk]
                demb_chunk = torch.bmm(dlogits.transpose(1, 2), qs).transpose(1, 2)  # [L (x), dk, L (i)], emb's layout
                demb = demb_chunk.to(ctx.emb_dtype) if demb is None else demb.add_(demb_chunk)
            dq, dv = (dqs[0], dvs[0]) if len(dqs) == 1 else (torch.cat(dqs, 1), torch.cat(dvs))
            dcontext = None
            if context is not None:  # content attention: context^T q
                heads = context.shape[0]
                dcontext = torch.bmm(_content_queries(q, heads), grad_content.transpose(1, 2))  # [B * Nh, dk, dv]
                if graph_mode():  # not in place: a captured graph replays a mutated view, failing on symbolic sizes
                    dq = torch.baddbmm(_content_queries(dq, heads), context, grad_content)  # [B * Nh, dk, HW]
                    dq = dq.permute(2, 0, 1).reshape(q.shape)
                else:  # in place, dq stays [L, G, dk]: no copy of it, no reordered copy back
                    _content_queries(dq, heads).baddbmm_(context, grad_content)
            return dq, dv, demb, None, dcontext


def column_attention(q: Tensor, v: Tensor, table: Optional[Tensor], chunk_elems: Optional[int] = None,
                     embeddings: Optional[Tensor] = None, context: Optional[Tensor] = None):
    """Column-only positional attention, GSA appendix eq. (5)-(7).

    ``out[x, y] = sum_i (q[x, y] . R[i - x]) v[i, y]`` (no softmax, as eq. (2)).

    Args:
        q (Tensor): ``[B, Nh, dkh, H, W]``; v (Tensor): ``[B, Nh, dvh, H, W]``.
        table (Tensor | None): ``[2M - 1, dkh]``; offsets beyond ``M - 1`` are clipped.
        chunk_elems (int, optional): logits ``[sequences, H, H]`` per chunk. Defaults to
            :func:`axial_chunk_elems`.
        embeddings (Tensor, optional): ``[H, H, dkh]``, ``table`` already read at every pair
            (:func:`axial_embeddings`), instead of ``table``.
        context (Tensor, optional): ``[B * Nh, dkh, dvh]`` (:func:`content_context`): content
            attention's product with the same ``q`` is computed in this kernel too.

    Returns:
        Tensor | tuple[Tensor, Tensor]: ``[B, Nh, dvh, H, W]`` in :func:`compute_dtype` of
        ``q``'s dtype; with ``context``, content attention's output (same shape) too.
    """
    B, Nh, dk, H, W = q.shape
    device = kernel_device(q.device.type)
    dtype = compute_dtype(q.dtype, device)
    if chunk_elems is None:
        chunk_elems = axial_chunk_elems(device)
    G = B * Nh * W
    chunk = G if chunk_elems is None else max(1, chunk_elems // (H * H))
    with torch.autocast(q.device.type, enabled=False):  # one dtype inside
        qc = packed(q.permute(AXIAL_Q), dtype).view(H, G, dk)  # [H, G = (W, B, Nh), dkh]
        vc = v.permute(COLUMN_V)  # [W, B, Nh, dvh, H]: read in place where laid out so or as AXIAL_V (strided g)
        vc = (vc if v.permute(AXIAL_V).is_contiguous() and v.dtype == dtype else packed(vc, dtype)).view(G, -1, H)
        if embeddings is None:
            embeddings = relative_embeddings(table.to(torch.promote_types(dtype, torch.float32)), H)
        emb = embeddings.transpose(1, 2)  # [H (x), dkh, H (i)]: R[i - x]
        if torch.is_grad_enabled() and not torch.jit.is_tracing():
            out = _AxialRelativeAttention.apply(qc, vc, emb, chunk, context)  # [G, dvh, H]
        else:  # inference, trace and export: plain ops, no autograd.Function in the graph
            out = _axial_chunks(qc, vc, emb.to(dtype), chunk)
            out = out if context is None else (out, _content_product(qc, context))
    out, content = (out, None) if context is None else out  # [G, dvh, H], [B * Nh, dvh, HW]
    out = out.view(W, B, Nh, -1, H).permute(1, 2, 3, 4, 0)  # [B, Nh, dvh, H, W], laid out [W, B, Nh, dvh, H]
    return out if context is None else (out, content.view(B, Nh, -1, H, W))


def row_attention(q: Tensor, v: Tensor, table: Optional[Tensor], chunk_elems: Optional[int] = None,
                  embeddings: Optional[Tensor] = None) -> Tensor:
    """Row-only positional attention: :func:`column_attention` on transposed maps."""
    return column_attention(q.transpose(-1, -2), v.transpose(-1, -2), table,
                            chunk_elems, embeddings).transpose(-1, -2)


def axial_embeddings(table_col: Tensor, table_row: Tensor, H: int, W: int, dtype: torch.dtype):
    """:func:`relative_embeddings` of both axes in one gather (one index into the tables'
    concatenation, :func:`size_constant`) and one cast to ``dtype``.

    Args:
        table_col, table_row (Tensor): ``[2Mc - 1, dkh]``, ``[2Mr - 1, dkh]``.

    Returns:
        tuple[Tensor, Tensor]: ``[H, H, dkh]`` and ``[W, W, dkh]`` in ``dtype``.
    """
    Mc, Mr = (table_col.shape[0] + 1) // 2, (table_row.shape[0] + 1) // 2
    tables = torch.cat([table_col, table_row]).to(torch.promote_types(dtype, torch.float32))
    emb = tables.index_select(0, size_constant(_axial_index, H, Mc, W, Mr, tables.device)).to(dtype)  # [H^2 + W^2, dkh]
    emb_col, emb_row = emb.split([H * H, W * W])  # its backward: one concatenation
    return emb_col.view(H, H, -1), emb_row.view(W, W, -1)


def _axial_index(H: int, Mc: int, W: int, Mr: int, device) -> Tensor:
    """Rows of ``cat([table_col, table_row])`` for every (query, key) pair of a column, then of a
    row: ``[H * H + W * W]`` long."""
    return torch.cat([relative_index(H, Mc, device).flatten(), relative_index(W, Mr, device).flatten() + 2 * Mc - 1])


@MODELS.register_module('GSA')
class GlobalSelfAttention2d(BaseModule):
    """Global self-attention (GSA) module, a drop-in for a 3x3 convolution.

    Has ``nn.Conv2d``'s signature so ``build_conv_layer`` builds it from ``dict(type='GSA', ...)``.

    Args:
        in_channels (int): input channels.
        out_channels (int): output (= value) channels.
        kernel_size (int): kernel of the convolution it replaces, odd (the attention is global). Defaults to 3.
        padding (int, optional): None or that convolution's 'same' padding, ``(kernel_size - 1) // 2``.
        dilation, groups, bias: the neutral values only (1, 1, False); other values are refused.
        stride (int): 1, or 2 for a 2x2 average pool (``ceil_mode``) after the module (GSA Sec. 4).
        num_heads (int): heads. Defaults to 8.
        key_channels (int, optional): channels of keys and queries. Defaults to ``in_channels`` (GSA Sec. 4).
        components (Sequence[str]): any of 'content', 'column', 'row' (GSA Table 4). Defaults to all three.
        max_rel_dist (int): relative tables cover offsets up to ``max_rel_dist - 1``; larger ones clip (at test
            time, at the largest trained offset: :class:`TrainedOffsetRange`). Defaults to 64.
        norm_cfg (dict): norm between the column and row sub-layers. Defaults to ``dict(type='BN')``.
        axial_scale (str): how the column and row sums scale with their axis length ``L`` (docs/design.md,
            "GSA at any test size"): ``'trained'``, eq. (7)'s sums up to the longest trained length ``T``,
            rescaled by ``T / L`` beyond; ``'sum'``, eq. (7)'s sums at every size (the paper's form);
            ``'mean'``, sums divided by ``L`` at every size. Defaults to ``'trained'``.
        init_cfg (dict, optional): mmengine init config.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: Optional[int] = None, dilation: int = 1, groups: int = 1, bias: bool = False,
                 num_heads: int = 8, key_channels: Optional[int] = None, components: Sequence[str] = GSA_COMPONENTS,
                 max_rel_dist: int = 64, norm_cfg: dict = dict(type='BN'), axial_scale: str = 'trained',
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg)
        key_channels = in_channels if key_channels is None else key_channels
        for name, value in (('key_channels', key_channels), ('out_channels', out_channels)):
            if value <= 0 or value % num_heads:
                raise ValueError(f'GlobalSelfAttention2d: {name}={value} must be a positive '
                                 f'multiple of num_heads={num_heads}')
        components = tuple(components)
        if not components or any(c not in GSA_COMPONENTS for c in components):
            raise ValueError(f'GlobalSelfAttention2d: components must be a non-empty subset of '
                             f'{GSA_COMPONENTS}, got {components}')
        for name, value, allowed in (('axial_scale', axial_scale, AXIAL_SCALES), ('stride', stride, (1, 2))):
            if value not in allowed:
                raise ValueError(f'GlobalSelfAttention2d: {name} must be one of {allowed}, got {value!r}')
        for name, value, neutral in (('dilation', dilation, 1), ('groups', groups, 1), ('bias', bias, False)):
            if value != neutral:
                raise ValueError(f'GlobalSelfAttention2d: {name}={value!r} is not supported (global attention has '
                                 f'no dilation, groups or bias); use {name}={neutral!r}')
        if kernel_size % 2 != 1 or padding not in (None, (kernel_size - 1) // 2):
            raise ValueError(f"GlobalSelfAttention2d: kernel_size={kernel_size}, padding={padding} is not a 'same' "
                             f"convolution's: use an odd kernel_size and padding None or {(kernel_size - 1) // 2}")
        if not isinstance(max_rel_dist, numbers.Integral) or max_rel_dist < 1:  # it sizes the tables
            raise ValueError(f'GlobalSelfAttention2d: max_rel_dist must be an int >= 1, got {max_rel_dist!r}')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.key_channels, self.num_heads, self.stride = key_channels, num_heads, stride
        self.head_dim = key_channels // num_heads
        self.components, self.axial_scale = components, axial_scale
        self.qkv = nn.Conv2d(in_channels, 2 * key_channels + out_channels, 1, bias=False)
        if 'column' in components:
            self.rel_col = nn.Parameter(torch.empty(2 * max_rel_dist - 1, self.head_dim))
        if 'row' in components:
            self.rel_row = nn.Parameter(torch.empty(2 * max_rel_dist - 1, self.head_dim))
        if 'column' in components and 'row' in components:
            self.norm_col = build_norm_layer(norm_cfg, out_channels)[1]
        if 'column' in components or 'row' in components:
            self.offset_range = TrainedOffsetRange(max_rel_dist)  # offsets (column, row) trained so far
        # what each branch reads from the qkv output, laid out for its GEMMs (gsa_operands)
        self.operands = {}
        if 'content' in components or 'column' in components:
            self.operands.update(q=(0, AXIAL_Q), v=(2, AXIAL_V))  # content and column attention share both
        if 'row' in components:
            self.operands['q_row'] = (0, ROW_Q)
        if 'content' in components:
            self.operands['k'] = (1, None)
        if 'row' in components and 'column' not in components:
            self.operands['v_row'] = (2, ROW_V)
        reset_relative_tables(self, 'rel_col', 'rel_row')

    def relative_table(self, name: str, length: int) -> Tensor:
        """The rows of ``rel_col`` (``name='column'``) or ``rel_row`` a map of ``length`` along that axis
        may use (:class:`TrainedOffsetRange`): ``[2m - 1, dkh]``."""
        table = self.rel_col if name == 'column' else self.rel_row
        return self.offset_range.crop(table, 0 if name == 'column' else 1, length)

    def scale_axial(self, out: Tensor, name: str, length: int) -> Tensor:
        """``out``, the sum of the ``name`` (``'column'`` / ``'row'``) sub-layer over a map of ``length`` along
        its axis, scaled as ``axial_scale`` says.

        ``'trained'``: times ``T / L`` where the map is longer than the longest recorded axis ``T``; unscaled in
        a learning pass or without a record. In a captured graph, from the symbolic (traced) length.
        """
        if self.axial_scale == 'sum':
            return out
        if self.axial_scale == 'mean':
            return out * (1 / length)
        trained = self.offset_range.trained[0 if name == 'column' else 1] + 1  # T, 0 without a record
        if trained < 1 or self.offset_range.learns(self.rel_col if name == 'column' else self.rel_row):
            return out
        if torch.jit.is_tracing():  # TorchScript (and its ONNX exporter): the traced length is a tensor
            return out * (trained / torch.as_tensor(length).clamp(min=trained))
        if graph_mode():  # dynamo: a symbolic max, no guard on the length, nothing baked in
            return out * (trained / torch.sym_max(trained, length))
        return out * (trained / length) if length > trained else out

    def normalize_column(self, pos: Tensor) -> Tensor:
        """``norm_col`` on column attention's output ``[B, Nh, dvh, H, W]``, laid out ``[W, B, C, H]``: a batch
        norm reads it as ``[W * B, C, H, 1]`` (the same values per channel), without a copy."""
        B, _, _, H, W = pos.shape
        if not isinstance(self.norm_col, _BatchNorm):  # per-sample norms (GN, LN) read each sample's maps
            return self.norm_col(pos.reshape(B, -1, H, W)).reshape(pos.shape)
        out = self.norm_col(pos.permute(4, 0, 1, 2, 3).reshape(W * B, -1, H, 1))  # [W * B, C, H, 1]
        return out.view(W, B, self.num_heads, -1, H).permute(1, 2, 3, 4, 0)

    def init_weights(self):
        super().init_weights()
        reset_relative_tables(self, 'rel_col', 'rel_row')

    def forward(self, x: Tensor) -> Tensor:
        B, _, H, W = x.shape
        device = kernel_device(x.device.type)
        # fp16 autocast: the qkv conv in bf16 already, so x is cast once (its gradient back once), not the 3x wider qkv
        bf16 = autocast_dtype(x.device.type) == torch.float16 and compute_dtype(torch.float16, device) == torch.bfloat16
        with torch.autocast(x.device.type, dtype=torch.bfloat16) if bf16 else nullcontext():
            qkv = self.qkv(x)  # [B, 2 dk + dv, H, W]
        dtype = compute_dtype(qkv.dtype, device)
        qkv = qkv.to(dtype)  # float16 -> float32 where the GPU has no bfloat16, for every product and softmax
        args = (qkv, self.num_heads, (self.key_channels, self.key_channels, self.out_channels), dtype,
                tuple(self.operands.values()))
        ops = dict(zip(self.operands, gsa_operands(*args)))
        # with a column branch, content attention's product with q runs in its kernel
        alone = 'content' in self.components and 'column' not in self.components
        out = content_attention(ops['q'], ops['k'], ops['v']) if alone else 0
        emb_col = emb_row = None
        if 'column' in self.components and 'row' in self.components:  # both axes' embeddings at once
            emb_col, emb_row = axial_embeddings(self.relative_table('column', H), self.relative_table('row', W),
                                                H, W, ops['q'].dtype)
        if 'column' in self.components:
            pos = column_attention(ops['q'], ops['v'], None if emb_col is not None else
                                   self.relative_table('column', H), embeddings=emb_col,
                                   context=content_context(ops['k'], ops['v'], ops['q'].dtype)
                                   if 'content' in self.components else None)
            if 'content' in self.components:
                pos, out = pos
            pos = self.scale_axial(pos, 'column', H)
            if 'row' in self.components:
                pos = self.normalize_column(pos)
        else:
            pos = ops.get('v_row')
        if 'row' in self.components:
            pos = row_attention(ops['q_row'], pos, None if emb_row is not None else self.relative_table('row', W),
                                embeddings=emb_row)
            pos = self.scale_axial(pos, 'row', W)
        if pos is not None:
            out = out + pos  # [B, Nh, dvh, H, W]
        out = out.reshape(B, self.out_channels, H, W)
        if self.stride == 2:
            out = F.avg_pool2d(out, 2, 2, ceil_mode=True)
        return out
