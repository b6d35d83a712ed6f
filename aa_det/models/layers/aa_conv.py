"""Attention augmented convolution and its relative self-attention.

Bello et al., *Attention Augmented Convolutional Networks*, ICCV 2019, Sec. 3
and Fig. 2: ``AAConv(X) = Concat[Conv(X), MHA(X)]``, ``out_channels - dv`` conv
filters and ``dv`` attention channels, with eq. (3)'s logits
``q_i . k_j + q_i . r^H[h_j - h_i] + q_i . r^W[w_j - w_i]``.

:func:`relative_attention` computes eq. (3) exactly with one of four kernels
(tests: the float64 loop in ``tests/kernel_references.py``; docs/design.md, "AA
attention kernels"):

* ``'materialized'``: the paper's form, all ``[B, Nh, HW, HW]`` logits at once;
* ``'blocked'``: the same per block of queries, each recomputed in the backward
  (memory linear in HW); the CPU's;
* ``'flex'``: FlexAttention, the relative logits added by its ``score_mod``;
  CUDA's (torch >= 2.6);
* ``'sdpa'``: the relative logits folded into one fused
  ``scaled_dot_product_attention``; a CPU graph's, and CUDA's before torch 2.6.

Which one ``'auto'`` takes on which device is :mod:`.device_policy`'s.

Example:
    >>> import torch
    >>> conv = AAConv2d(64, 64, 3, key_ratio=0.25, value_ratio=0.25,
    ...                 num_heads=4, min_key_dim_per_head=4)
    >>> conv(torch.rand(2, 64, 9, 13)).shape
    torch.Size([2, 64, 9, 13])
    >>> AAConv2d(64, 64, 3, stride=2,
    ...          num_heads=4)(torch.rand(1, 64, 9, 13)).shape
    torch.Size([1, 64, 5, 7])
"""
import functools
import itertools
import numbers
from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_conv_layer
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import Tensor

from ...utils.compat import flex_attention, is_capturing_graph, is_exporting
from .device_policy import HAS_FLEX_ATTENTION, device_policy
from .position_encoding import coord_channels, sine_encoding_2d
from .relative_position import (TrainedOffsetRange, relative_embeddings,
                                reset_relative_tables)

POSITION_ENCODINGS = ('relative', 'none', 'sine', 'coord')
#: :func:`relative_attention`'s kernels
IMPLS = ('auto', 'blocked', 'flex', 'sdpa', 'materialized')
#: logits ``B * Nh * queries * HW`` of one 'blocked' block: 16 MiB in float32,
#: cache-sized on a CPU
BLOCK_LOGITS = 1 << 22
#: the smallest head dim FlexAttention's Triton kernel takes (its dot products)
FLEX_MIN_HEAD_DIM = 16


def round_to_heads(channels: float, num_heads: int) -> int:
    """Round to the nearest positive multiple of ``num_heads``."""
    return max(num_heads, int(round(channels / num_heads)) * num_heads)


def aa_channels(out_channels: int, key_ratio: float, value_ratio: float,
                num_heads: int, min_key_dim_per_head: int):
    """Key depth ``dk`` and value depth ``dv`` of an AA conv (see
    docs/design.md).

    ``dk = max(round(kappa * F_out), min_key_dim_per_head * Nh)`` and
    ``dv = min(round(upsilon * F_out), F_out)``, rounded to multiples of
    ``Nh``. This reading reproduces the AA paper's parameter counts (Tables 2,
    5 and 9).
    """
    if num_heads < 1:
        raise ValueError(f'AAConv2d: num_heads must be >= 1, got {num_heads}')
    dk = max(
        round_to_heads(key_ratio * out_channels, num_heads),
        min_key_dim_per_head * num_heads)
    dv = min(
        round_to_heads(value_ratio * out_channels, num_heads), out_channels)
    return dk, dv


@MODELS.register_module('AAConv')
class AAConv2d(BaseModule):
    """Attention augmented convolution (AA paper, Sec. 3.3, Fig. 2).

    Has ``nn.Conv2d``'s signature so ``build_conv_layer`` builds it from
    ``dict(type='AAConv', ...)``.

    Args:
        in_channels (int): ``F_in``.
        out_channels (int): ``F_out`` of the convolution it replaces.
        kernel_size (int): kernel of the convolutional part. Defaults to 3.
        stride (int): 1 or 2: the convolution is strided, the attention input
            pooled (3x3 average, same stride) to the same output size. Defaults
            to 1.
        padding (int, optional): None or 'same' padding,
            ``dilation * (kernel_size - 1) // 2``; other values are refused.
            Defaults to None.
        dilation (int): dilation of the convolutional part. Defaults to 1.
        groups (int): must be 1.
        bias (bool): bias of the convolutional part. Defaults to False.
        key_ratio (float): ``kappa = dk / F_out``, at least 0. Defaults to 0.2.
        value_ratio (float): ``upsilon = dv / F_out``, in ``(0, 1]`` (1.0:
            fully attentional; below 1, ``dv`` must round to fewer than
            ``out_channels``). Defaults to 0.1.
        num_heads (int): ``Nh``, at least 1. Defaults to 8.
        min_key_dim_per_head (int): lower bound on ``dkh`` (the paper's 20).
            Defaults to 20.
        key_channels (int, optional): explicit ``dk``, overrides ``key_ratio``.
        value_channels (int, optional): explicit ``dv``, overrides
            ``value_ratio``.
        position (str): 'relative' (eq. (3)), 'none', 'sine' (2D sinusoids
            added to the attention input) or 'coord' (CoordConv x, y, r
            channels appended to it). Defaults to 'relative'.
        max_rel_dist (int): relative tables cover offsets up to
            ``max_rel_dist - 1``; larger ones clip (at test time, at the
            largest trained offset: :class:`TrainedOffsetRange`). Defaults
            to 64.
        attn_downsample (bool): 3x3 average pool (stride 2) before the
            attention and bilinear upsampling after it. Defaults to False.
        impl (str): attention kernel, see :func:`relative_attention`. Defaults
            to 'auto'.
        conv_cfg (dict, optional): ``build_conv_layer`` config of the
            convolutional part, e.g. ``dict(type='DCN', deform_groups=1)``.
            Defaults to None (``nn.Conv2d``).
        init_cfg (dict, optional): mmengine init config. Defaults to None.
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
                 key_ratio: float = 0.2,
                 value_ratio: float = 0.1,
                 num_heads: int = 8,
                 min_key_dim_per_head: int = 20,
                 key_channels: Optional[int] = None,
                 value_channels: Optional[int] = None,
                 position: str = 'relative',
                 max_rel_dist: int = 64,
                 attn_downsample: bool = False,
                 impl: str = 'auto',
                 conv_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg)
        if key_channels is None and key_ratio < 0:
            raise ValueError(
                f'AAConv2d: key_ratio must be >= 0, got {key_ratio}')
        # above 1, dv's clip made it 1.0 unsaid
        if value_channels is None and not 0 < value_ratio <= 1:
            raise ValueError(
                f'AAConv2d: value_ratio must be in (0, 1] (1.0: fully '
                f'attentional), got {value_ratio}')
        dk, dv = aa_channels(out_channels, key_ratio, value_ratio, num_heads,
                             min_key_dim_per_head)
        dk = dk if key_channels is None else key_channels
        dv = dv if value_channels is None else value_channels
        for name, value in (('key_channels (dk)', dk), ('value_channels (dv)',
                                                        dv)):
            if value <= 0 or value % num_heads:
                raise ValueError(
                    f'AAConv2d: {name}={value} must be a positive multiple of '
                    f'num_heads={num_heads}')
        if dv > out_channels:
            raise ValueError(f'AAConv2d: value_channels (dv)={dv} exceeds '
                             f'out_channels={out_channels}')
        if dv == out_channels and value_channels is None and value_ratio < 1:
            raise ValueError(
                f'AAConv2d: value_ratio={value_ratio} of '
                f'out_channels={out_channels} rounds to dv={dv} (a multiple '
                f'of num_heads={num_heads}), which leaves no convolutional '
                f'channels; use more out_channels or fewer heads, or '
                f'value_ratio=1.0 for a fully attentional layer')
        for name, value, allowed in (('position', position,
                                      POSITION_ENCODINGS), ('stride', stride,
                                                            (1, 2)),
                                     ('groups', groups, (1, )), ('impl', impl,
                                                                 IMPLS)):
            if value not in allowed:
                raise ValueError(
                    f'AAConv2d: {name} must be one of {allowed}, got {value!r}'
                )
        if kernel_size % 2 != 1:
            raise ValueError(
                f'AAConv2d: kernel_size must be odd, got {kernel_size}')
        same = dilation * (kernel_size - 1) // 2
        if padding not in (None, same):
            raise ValueError(
                f"AAConv2d: padding={padding} is not supported: the attention "
                f"branch keeps 'same' padding, {same} for "
                f"kernel_size={kernel_size} and dilation={dilation} (or None)")
        # it sizes the tables
        if not isinstance(max_rel_dist, numbers.Integral) or max_rel_dist < 1:
            raise ValueError(
                f'AAConv2d: max_rel_dist must be an int >= 1, got '
                f'{max_rel_dist!r}')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.stride, self.num_heads = stride, num_heads
        self.key_channels, self.value_channels = dk, dv
        self.head_dim = dk // num_heads
        # a float, computed once: torch 2.4 - 2.5 make the int attribute
        # symbolic under dynamic=True, and torch 2.4 guards on `head_dim **
        # -0.5` with a ToFloat that never passes: a recompile per size
        self.scale = self.head_dim**-0.5
        self.position, self.attn_downsample, self.impl = (position,
                                                          attn_downsample,
                                                          impl)

        conv_channels = out_channels - dv
        self.conv = build_conv_layer(
            conv_cfg,
            in_channels,
            conv_channels,
            kernel_size,
            stride,
            same,
            dilation,
            bias=bias) if conv_channels > 0 else None
        attn_in = in_channels + 3 if position == 'coord' else in_channels
        # one 1x1 conv for k, q, v (Fig. 2)
        self.qkv = nn.Conv2d(attn_in, 2 * dk + dv, 1)
        self.proj = nn.Conv2d(dv, dv, 1)  # W^O mixes the heads, eq. (2)
        if position == 'relative':
            self.rel_h = nn.Parameter(
                torch.empty(2 * max_rel_dist - 1, self.head_dim))
            self.rel_w = nn.Parameter(
                torch.empty(2 * max_rel_dist - 1, self.head_dim))
            # offsets (h, w) trained so far
            self.offset_range = TrainedOffsetRange(max_rel_dist)
            reset_relative_tables(self, 'rel_h', 'rel_w')

    def relative_tables(self, h: int, w: int):
        """The rows of ``rel_h`` / ``rel_w`` an ``h x w`` attention grid may
        use (:class:`TrainedOffsetRange`), ``[2 mh - 1, dkh]`` and
        ``[2 mw - 1, dkh]``; ``(None, None)`` without relative position."""
        if self.position != 'relative':
            return None, None
        return self.offset_range.crop(self.rel_h, 0,
                                      h), self.offset_range.crop(
                                          self.rel_w, 1, w)

    def init_weights(self):
        super().init_weights()
        # none without relative position
        reset_relative_tables(self, 'rel_h', 'rel_w')

    def attention_input(self, x: Tensor) -> Tensor:
        """Strided / downsampled input of the attention branch, with absolute
        position encodings when selected."""
        if self.stride > 1:
            x = F.avg_pool2d(x, 3, self.stride, 1)
        if self.attn_downsample:
            x = F.avg_pool2d(x, 3, 2, 1)
        if self.position == 'sine':
            x = x + sine_encoding_2d(*x.shape[-2:], x.shape[1], x.device,
                                     x.dtype)
        elif self.position == 'coord':
            x = coord_channels(x)
        return x

    def qkv_heads(self, x: Tensor):
        """Queries, keys and values per head of the attention input ``x``
        ``[B, C, h, w]``, from one 1x1 conv (Fig. 2): ``q, k``
        ``[B, Nh, hw, dkh]``, ``v`` ``[B, Nh, hw, dvh]``, and ``(h, w)``."""
        B, _, h, w = x.shape
        k, q, v = self.qkv(x).split(
            [self.key_channels, self.key_channels, self.value_channels], 1)
        shape = (B, self.num_heads, -1, h * w)
        # [B, Nh, d, hw]
        q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        return q.transpose(-1, -2), k.transpose(-1,
                                                -2), v.transpose(-1,
                                                                 -2), (h, w)

    def forward(self, x: Tensor) -> Tensor:
        out_size = (x.shape[-2] - 1) // self.stride + 1, (x.shape[-1] -
                                                          1) // self.stride + 1
        # [B, Nh, hw, d]
        q, k, v, (h, w) = self.qkv_heads(self.attention_input(x))
        attn = relative_attention(
            q,
            k,
            v,
            *self.relative_tables(h, w),
            h,
            w,
            impl=self.impl,
            scale=self.scale)  # [B, Nh, hw, dvh]
        # inductor cannot order the symbolic strides of the view proj would
        # save (2.14)
        if is_capturing_graph():
            # [dv, Nh, dvh]
            weight = self.proj.weight.view(self.value_channels, self.num_heads,
                                           -1).to(attn.dtype)
            # W^O as one GEMM
            attn = torch.einsum('bnpc,onc->bop', attn,
                                weight).unflatten(-1, (h, w))
            attn = attn + self.proj.bias.to(attn.dtype).view(-1, 1, 1)
        else:
            # W^O, eq. (2)
            attn = self.proj(
                attn.transpose(-1, -2).reshape(x.shape[0], self.value_channels,
                                               h, w))
        if (h, w) != out_size:
            attn = F.interpolate(
                attn, size=out_size, mode='bilinear', align_corners=False)
        if self.conv is None:
            return attn
        # [B, F_out, H / s, W / s]
        return torch.cat([self.conv(x), attn], dim=1)


def relative_logits(q: Tensor, emb_h: Tensor,
                    emb_w: Tensor) -> Tuple[Tensor, Tensor]:
    """Eq. (3)'s relative terms of a ``h x w`` rectangle of queries:
    ``rel_h[.., i, j] = q_i . r^H[j - h_i]`` and
    ``rel_w[.., i, j] = q_i . r^W[j - w_i]`` (the paper's ``S^H``, ``S^W``
    before broadcasting).

    Args:
        q (Tensor): ``[B, Nh, h, w, d]`` scaled queries.
        emb_h (Tensor): ``[h, H, d]``, the rows of :func:`relative_embeddings`
            of the height table for the queries' rows; emb_w (Tensor):
            ``[w, W, d]``, those of the width table for their columns.

    Returns:
        tuple[Tensor, Tensor]: ``[B, Nh, hw, H]`` and ``[B, Nh, hw, W]``.
    """
    # [B, Nh, h, w, H (h_j)]
    rel_h = torch.einsum('bnhwd,hjd->bnhwj', q, emb_h)
    # [B, Nh, h, w, W (w_j)]
    rel_w = torch.einsum('bnhwd,wjd->bnhwj', q, emb_w)
    return rel_h.flatten(2, 3), rel_w.flatten(2, 3)


def attention_materialized(q: Tensor, k: Tensor, v: Tensor,
                           rel_h: Optional[Tensor], rel_w: Optional[Tensor],
                           H: int, W: int) -> Tensor:
    """``softmax(q k^T + S^H + S^W) v`` with all logits at once (eq. (3), the
    paper's implementation).

    Args:
        q (Tensor): ``[B, Nh, n, d]``, any ``n`` queries; k (Tensor):
            ``[B, Nh, HW, d]``; v (Tensor): ``[B, Nh, HW, dv]``.
        rel_h, rel_w (Tensor | None): :func:`relative_logits` of those queries,
        or None.

    Returns:
        Tensor: ``[B, Nh, n, dv]``.
    """
    logits = q @ k.transpose(-1, -2)  # [B, Nh, n, HW]
    if rel_h is not None:
        logits = (logits.unflatten(-1, (H, W)) + rel_h.unsqueeze(-1) +
                  rel_w.unsqueeze(-2)).flatten(-2)
    return logits.softmax(-1) @ v


class _BlockedAttention(torch.autograd.Function):
    """:func:`attention_materialized` per ``bh x bw`` rectangle of queries,
    their relative logits included. The forward keeps no block; the backward
    recomputes each block under autograd and takes its gradients, so both
    passes hold one block of logits, and the relative logits (``H + W`` numbers
    per query and head) are never kept whole.

    Outputs and gradients are written into whole tensors: small tensors left
    behind between freed blocks would fragment the CPU allocator's heap and
    grow the peak RSS with every block.
    """

    @staticmethod
    def forward(ctx, q, k, v, emb_h, emb_w, H, W, bh, bw):
        ctx.save_for_backward(q, k, v, emb_h, emb_w)
        ctx.H, ctx.W, ctx.bh, ctx.bw = H, W, bh, bw
        q = q.unflatten(2, (H, W))  # [B, Nh, H, W, d]
        out = v.new_empty(*q.shape[:4], v.shape[-1])  # [B, Nh, H, W, dv]
        for h0, w0 in itertools.product(range(0, H, bh), range(0, W, bw)):
            rows, cols = slice(h0, h0 + bh), slice(w0, w0 + bw)
            q_b = q[:, :, rows, cols]  # [B, Nh, bh, bw, d]
            rel = (None, None) if emb_h is None else relative_logits(
                q_b, emb_h[rows], emb_w[cols])
            out[:, :, rows, cols] = attention_materialized(
                q_b.flatten(2, 3), k, v, *rel, H,
                W).unflatten(2, q_b.shape[2:4])
        return out.flatten(2, 3)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, emb_h, emb_w = ctx.saved_tensors
        H, W = ctx.H, ctx.W
        # [B, Nh, H, W, d]
        q, grad_out = q.unflatten(2, (H, W)), grad_out.unflatten(2, (H, W))
        k, v = k.detach().requires_grad_(), v.detach().requires_grad_()
        embs = () if emb_h is None else (emb_h, emb_w)
        # written per block
        dq, dk, dv, *demb = [torch.zeros_like(t) for t in (q, k, v, *embs)]
        # the forward's dtype
        with torch.enable_grad(), torch.autocast(q.device.type, enabled=False):
            for h0, w0 in itertools.product(
                    range(0, H, ctx.bh), range(0, W, ctx.bw)):
                rows, cols = slice(h0, h0 + ctx.bh), slice(w0, w0 + ctx.bw)
                q_b = q[:, :, rows, cols].detach().requires_grad_()
                e_b = [
                    e[sl].detach().requires_grad_()
                    for e, sl in zip(embs, (rows, cols))
                ]
                rel = relative_logits(q_b, *e_b) if e_b else (None, None)
                out = attention_materialized(
                    q_b.flatten(2, 3), k, v, *rel, H, W)
                g_q, g_k, g_v, *g_e = torch.autograd.grad(
                    out, (q_b, k, v, *e_b), grad_out[:, :, rows,
                                                     cols].flatten(2, 3))
                dq[:, :, rows, cols] = g_q
                # keys and values: every block's queries read them all
                dk += g_k
                dv += g_v
                for d, g, sl in zip(demb, g_e, (rows, cols)):
                    d[sl] += g
        return (dq.flatten(2, 3), dk, dv, *(demb or (None, None)), None, None,
                None, None)


def attention_blocked(q: Tensor,
                      k: Tensor,
                      v: Tensor,
                      emb_h: Optional[Tensor],
                      emb_w: Optional[Tensor],
                      H: int,
                      W: int,
                      block_logits: int = BLOCK_LOGITS) -> Tensor:
    """Eq. (3) over blocks of queries of at most ``block_logits`` logits (at
    least one query): whole rows of the map, or runs of one row where a row is
    more, each recomputed in the backward (:class:`_BlockedAttention`). Memory
    linear in HW.

    Args:
        q, k, v (Tensor): as :func:`attention_materialized`, ``n = HW``. emb_h,
        emb_w (Tensor | None): :func:`relative_embeddings` of the tables,
        ``[H, H, d]`` and ``[W, W, d]``.
    """
    B, Nh, N, _ = q.shape
    queries = max(1, block_logits // (B * Nh * N))
    if queries >= N:
        rel = (None, None) if emb_h is None else relative_logits(
            q.unflatten(2, (H, W)), emb_h, emb_w)
        return attention_materialized(q, k, v, *rel, H, W)
    bh, bw = (queries // W, W) if queries >= W else (1, queries)
    # [B, Nh, HW, dv]
    return _BlockedAttention.apply(q, k, v, emb_h, emb_w, H, W, bh, bw)


def attention_sdpa(q: Tensor, k: Tensor, v: Tensor, rel_h: Optional[Tensor],
                   rel_w: Optional[Tensor], H: int, W: int) -> Tensor:
    """Eq. (3) in one fused ``scaled_dot_product_attention``, in ``q``'s dtype.

    The relative logits fold into the dot product: ``[q_i, S^H_i, S^W_i] .
    [k_j, onehot(h_j), onehot(w_j)] = q_i . k_j + S^H_i[h_j] + S^W_i[w_j]``.
    Head dims are zero-padded to multiples of 8, which the fused kernels need
    (otherwise SDPA falls back to its math kernel, which holds every logit). In
    float16 the folded logits are ``S / s`` against one-hots of ``s``, a power
    of two that keeps them in float16's range.

    Returns:
        Tensor: ``[B, Nh, HW, dv]``.
    """
    B, Nh, N, d = q.shape
    dv, dtype = v.shape[-1], q.dtype
    # zero columns add nothing to the output's first dv
    v = F.pad(v, (0, (8 - dv % 8) % 8))
    if rel_h is None:
        q, k = F.pad(q, (0, (8 - d % 8) % 8)), F.pad(k, (0, (8 - d % 8) % 8))
    else:
        # in a captured graph 8 more: a symbolic pad that may be 0 or 1 would
        # be guarded, one graph per case
        pad = (8 - (d + H + W) % 8) % 8 + (8 if is_capturing_graph() else 0)
        # [H (h_j), W, H]
        one_h = torch.eye(H, device=q.device)[:, None].expand(H, W, H)
        # [H, W (w_j), W + pad]
        one_w = torch.eye(W, W + pad, device=q.device).expand(H, W, W + pad)
        # [1, 1, HW, H + W + pad]
        columns = torch.cat([one_h, one_w], -1).view(1, 1, N, -1)
        if dtype == torch.float16:  # s bounds |S| / s by 2^14
            bound = torch.maximum(rel_h.detach().abs().amax(),
                                  rel_w.detach().abs().amax())
            s = torch.exp2(
                torch.frexp(bound / 2**14).exponent.clamp(0,
                                                          15).to(bound.dtype))
            rel_h, rel_w, columns = rel_h / s, rel_w / s, columns * s
        # [B, Nh, HW, d + H + W + pad]
        q = torch.cat([q, rel_h.to(dtype),
                       F.pad(rel_w, (0, pad)).to(dtype)], -1)
        columns = columns.to(dtype)
        k = torch.cat([k, columns.expand(B, Nh, N, -1)], -1)
    return F.scaled_dot_product_attention(q, k, v, scale=1.0)[..., :dv]


def relative_score_mod(rel: Tensor,
                       rows_h: int,
                       scale: float = 1.0) -> Callable:
    """FlexAttention's ``score_mod`` adding eq. (3)'s relative logits, scaled
    as the score: query ``i`` at ``(h_i, w_i)`` and key ``j`` at ``(h_j, w_j)``
    of a map of width ``W`` get ``S^H = rel[.., h_i, w_i, h_j - h_i]`` (the
    first ``rows_h`` rows) and ``S^W = rel[.., w_j - w_i]`` (the others),
    offsets clipped to the rows given.

    Args:
        rel (Tensor): ``[B, Nh, H, W, 2 mh - 1 + 2 mw - 1]``, ``q_i . r^H[o]``
            of every query and offset ``o = -(mh - 1) .. mh - 1``, then
            ``q_i . r^W[o]`` (:func:`offset_logits`).
        rows_h (int): ``2 mh - 1``, the rows of ``r^H``.
        scale (float): the factor of the score ``q_i . k_j``, applied to the
            relative logits too.

    Returns:
        Callable: ``(score, b, n, i, j) -> score + scale (S^H + S^W)``,
        elementwise (any broadcast of index tensors).
    """

    def relative_score(score, b, n, i, j):
        W, mh, mw = rel.shape[3], (rows_h + 1) // 2, (rel.shape[4] - rows_h +
                                                      1) // 2
        hi, wi, hj, wj = i // W, i % W, j // W, j % W
        # the offset's row of the tables
        dh = (hj - hi).clamp(1 - mh, mh - 1) + mh - 1
        dw = (wj - wi).clamp(1 - mw, mw - 1) + mw - 1 + rows_h
        return score + scale * (rel[b, n, hi, wi, dh] + rel[b, n, hi, wi, dw])

    return relative_score


def offset_logits(q: Tensor, table: Tensor, H: int, W: int) -> Tensor:
    """``q_i . r[o]`` of every query and every row of relative tables (one
    GEMM): the relative logits by offset, which :func:`relative_score_mod`
    reads at each key's offset.

    Args:
        q (Tensor): ``[B, Nh, HW, d]``; table (Tensor): ``[R, d]``, rows of one
            or more tables.

    Returns:
        Tensor: ``[B, Nh, H, W, R]``.
    """
    return (q @ table.transpose(0, 1)).unflatten(2, (H, W))


@functools.lru_cache(maxsize=None)
def _compiled_flex_attention() -> Callable:
    """FlexAttention compiled once for every size (its fused kernel exists only
    compiled)."""
    return torch.compile(flex_attention, dynamic=True)


def attention_flex(q: Tensor,
                   k: Tensor,
                   v: Tensor,
                   rel: Optional[Tensor],
                   rows_h: int,
                   scale: float,
                   rel_scale: Optional[float] = None) -> Tensor:
    """Eq. (3) in FlexAttention: ``softmax(scale (q k^T + S^H + S^W)) v``, the
    relative logits added inside the fused kernel by :func:`relative_score_mod`
    (no ``(HW)^2`` logits kept; the kernel's backward takes the gradient of
    ``rel`` too). Eager CUDA callers get it compiled; a graph traces it as it
    is; eager CPU callers (tests) get torch's dense reference of it, forward
    only.

    Args:
        q, k (Tensor): ``[B, Nh, HW, d]``; v (Tensor): ``[B, Nh, HW, dv]``;
            head dims at least :data:`FLEX_MIN_HEAD_DIM`.
        rel (Tensor | None): :func:`offset_logits` of the queries for both
            tables, or None (no position term).
        rows_h (int): the rows of ``rel`` that are ``r^H``'s.
        scale (float): the factor of the logits.
        rel_scale (float, optional): the factor of ``rel``'s logits. Defaults
            to ``scale``.

    Returns:
        Tensor: ``[B, Nh, HW, dv]``.
    """
    score_mod = None if rel is None else relative_score_mod(
        rel, rows_h, scale if rel_scale is None else rel_scale)
    flex = _compiled_flex_attention(
    ) if q.is_cuda and not is_capturing_graph() else flex_attention
    return flex(q, k, v, score_mod=score_mod, scale=scale)


def pad_head_dim(t: Tensor, size: int) -> Tensor:
    """``t`` ``[B, Nh, N, d]`` zero-padded to head dim ``size``, the padding
    written along ``N``'s stride-1 layout that the qkv conv leaves (its
    gradient goes back to the conv without a copy)."""
    pad = size - t.shape[-1]
    return F.pad(t.transpose(-1, -2),
                 (0, 0, 0, pad)).transpose(-1, -2) if pad > 0 else t


def _relative_attention_flex(q: Tensor, k: Tensor, v: Tensor,
                             table_h: Optional[Tensor],
                             table_w: Optional[Tensor], H: int, W: int,
                             scale: float) -> Tensor:
    """:func:`relative_attention`'s ``'flex'`` kernel on the inputs' dtype: the
    relative logits by offset of both tables in one GEMM (scaled inside the
    kernel), head dims zero-padded to what the kernel takes (zero channels add
    nothing to the logits, and the output's extra channels are dropped)."""
    dv = v.shape[-1]
    rel, rows_h, rel_scale = None, 0, scale
    if table_h is not None:
        # [2mh - 1 + 2mw - 1, d]
        tables = torch.cat([table_h, table_w]).to(q.dtype)
        # a traced score_mod takes no float that dynamic=True makes symbolic:
        # in a graph the tables carry the factor (fused into their cast)
        if is_capturing_graph():
            tables, rel_scale = tables * scale, 1.0
        rel, rows_h = offset_logits(q, tables, H, W), table_h.shape[0]
    q, k, v = (pad_head_dim(t, FLEX_MIN_HEAD_DIM) for t in (q, k, v))
    return attention_flex(q, k, v, rel, rows_h, scale, rel_scale)[..., :dv]


def attention_kernel(impl: str, q: Tensor) -> str:
    """The kernel :func:`relative_attention` runs for ``impl`` on ``q``: 'auto'
    is 'materialized' in the TorchScript ONNX exporter (ONNX has no fused
    attention), 'sdpa' in a graph exported or traced (FlexAttention has no ONNX
    lowering), else the device's (:func:`.device_policy.device_policy`), in
    eager mode or compiled."""
    if impl != 'auto':
        return impl
    if torch.onnx.is_in_onnx_export():
        return 'materialized'
    if torch.jit.is_tracing() or is_exporting():
        return 'sdpa'
    policy = device_policy(q.device)
    return policy.aa_graph_kernel if is_capturing_graph() else policy.aa_kernel


def relative_attention(q: Tensor,
                       k: Tensor,
                       v: Tensor,
                       table_h: Optional[Tensor],
                       table_w: Optional[Tensor],
                       H: int,
                       W: int,
                       impl: str = 'auto',
                       scale: float = 1.0,
                       block_logits: int = BLOCK_LOGITS) -> Tensor:
    """Multi-head 2D relative self-attention, eq. (3).

    'flex' and 'sdpa' run in the inputs' dtype (autocast's under AMP: the fused
    kernels keep the logits in float32); the other kernels and 'sdpa''s
    relative logits in float32 (float64 stays float64).

    Args:
        q, k (Tensor): ``[B, Nh, HW, d]`` queries and keys; v (Tensor):
        ``[B, Nh, HW, dv]`` values. table_h, table_w (Tensor | None):
        ``[2M - 1, d]`` relative embeddings, or None (no position term). H, W
        (int): the map, ``H * W == HW``.
        impl (str): 'blocked', 'flex', 'sdpa', 'materialized' or 'auto'
            (:func:`attention_kernel`). Defaults to 'auto'.
        scale (float): the logits' factor, ``d ** -0.5`` for unscaled ``q``.
            Defaults to 1.0.
        block_logits (int): logits per block of 'blocked'.

    Returns:
        Tensor: ``[B, Nh, HW, dv]`` in ``v``'s dtype.
    """
    if impl not in IMPLS:
        raise ValueError(f'impl must be one of {IMPLS}, got {impl!r}')
    impl = attention_kernel(impl, q)
    if impl == 'flex' and not HAS_FLEX_ATTENTION:
        raise ValueError(
            f"impl='flex' needs torch >= 2.6 (FlexAttention with gradients of "
            f"its score_mod's tensors); this is torch {torch.__version__}: "
            f"use 'auto'")
    out_dtype = v.dtype
    fused = impl in ('flex', 'sdpa')
    dtype = q.dtype if fused else torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if impl == 'flex':
            return _relative_attention_flex(q, k, v, table_h, table_w, H, W,
                                            scale).to(out_dtype)
        q = q * scale if scale != 1.0 else q
        emb_h = emb_w = None
        rel_dtype = torch.promote_types(dtype, torch.float32)
        # the tables read at every (query, key) offset: [H, H, d], [W, W, d]
        if table_h is not None:
            emb_h, emb_w = relative_embeddings(
                [table_h.to(rel_dtype),
                 table_w.to(rel_dtype)], [H, W])
        if impl == 'blocked':
            out = attention_blocked(q, k, v, emb_h, emb_w, H, W, block_logits)
        else:  # the relative logits of every query at once
            rel = (None, None) if emb_h is None else relative_logits(
                q.to(rel_dtype).unflatten(2, (H, W)), emb_h, emb_w)
            out = (attention_sdpa if impl == 'sdpa' else
                   attention_materialized)(q, k, v, *rel, H, W)
    return out.to(out_dtype)
