"""Exact 2D relative multi-head self-attention without (HW)x(HW) logits per head.

Bello et al., *Attention Augmented Convolutional Networks*, ICCV 2019, eq. (3)::

    logit(i, j) = q_i . k_j + q_i . r^H[h_j - h_i] + q_i . r^W[w_j - w_i]

with ``q`` scaled by ``dkh ** -0.5``. Per query the relative terms are tables of ``H`` and ``W`` numbers
(:func:`relative_logits`), added to the content logits by broadcasting; tables of ``2 * max_dist - 1`` rows
(:mod:`.relative_position`). Three exact kernels (tested against
``tests/kernel_references.py``); :func:`relative_attention` picks one and its dtype by :mod:`.kernel_policy`
(docs/design.md, "Attention kernels"):

* :func:`attention_materialized`: the paper's form, all logits at once.
* :func:`attention_blocked`: query blocks, flash-style, memory linear in HW; the CPU's kernel.
* :func:`attention_sdpa_folded`: relative logits folded into fused dot-product attention; CUDA's.
"""
import weakref
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...utils.compat import autocast_dtype, eye
from .kernel_policy import (CPU_BLOCK_ELEMS, choose_impl, graph_mode, kernel_device, kernel_dtype, packed,
                            size_constant)
from .relative_position import relative_embeddings, relative_index

__all__ = ['IMPLS', 'relative_attention', 'relative_logits', 'attention_materialized', 'attention_blocked',
           'attention_sdpa_folded', 'folded_queries']

#: ``relative_attention``'s kernels ('auto': :func:`choose_impl`)
IMPLS = ('auto', 'blocked', 'sdpa', 'materialized')


def relative_logits(q: Tensor, table_h: Tensor, table_w: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-query relative logits along height and width (eq. (3), S^H and S^W).

    One GEMM per axis, batched over the query's row (column), in the tables' dtype (float32 under AMP).

    Args:
        q (Tensor): ``[B, Nh, H, W, d]`` scaled queries.
        table_h (Tensor): ``[2 * Mh - 1, d]`` height embeddings.
        table_w (Tensor): ``[2 * Mw - 1, d]`` width embeddings.

    Returns:
        tuple[Tensor, Tensor]: ``rel_h`` ``[B, Nh, HW, H]`` with ``rel_h[.., i, h] = q_i . r^H[h - h_i]``
        and ``rel_w`` ``[B, Nh, HW, W]``.
    """
    B, Nh, H, W, d = q.shape
    qh = packed(q.permute(2, 0, 1, 3, 4), table_h.dtype).view(H, -1, d)  # [H, B * Nh * W, d]
    rel_h = torch.bmm(qh, relative_embeddings(table_h, H).transpose(1, 2))  # [H (h_i), B * Nh * W, H]
    qw = packed(q.permute(3, 0, 1, 2, 4), table_w.dtype).view(W, -1, d)  # [W, B * Nh * H, d]
    rel_w = torch.bmm(qw, relative_embeddings(table_w, W).transpose(1, 2))  # [W (w_i), B * Nh * H, W]
    return (rel_h.view(H, B, Nh, W, H).permute(1, 2, 0, 3, 4).reshape(B, Nh, H * W, H),
            rel_w.view(W, B, Nh, H, W).permute(1, 2, 3, 0, 4).reshape(B, Nh, H * W, W))


def _add_relative(logits: Tensor, rel_h: Optional[Tensor], rel_w: Optional[Tensor], H: int,
                  W: int) -> Tensor:
    """``logits [.., Q, HW] + rel_h[.., Q, h_j] + rel_w[.., Q, w_j]`` by broadcasting."""
    if rel_h is None:
        return logits
    shape = logits.shape  # in place: no second logits-sized tensor (matmul's backward needs no output)
    return logits.view(*shape[:-1], H, W).add_(rel_h.unsqueeze(-1)).add_(rel_w.unsqueeze(-2)).view(shape)


def attention_materialized(q: Tensor, k: Tensor, v: Tensor, rel_h: Optional[Tensor],
                           rel_w: Optional[Tensor], H: int, W: int) -> Tensor:
    """All ``[B, Nh, HW, HW]`` logits at once (the paper's implementation).

    Args:
        q, k (Tensor): ``[B, Nh, HW, d]``; v (Tensor): ``[B, Nh, HW, dv]``.
        rel_h, rel_w (Tensor | None): from :func:`relative_logits`.

    Returns:
        Tensor: ``[B, Nh, HW, dv]``.
    """
    logits = _add_relative(q @ k.transpose(-1, -2), rel_h, rel_w, H, W)  # [B, Nh, HW, HW]
    return logits.softmax(-1) @ v


def _block_probs(q: Tensor, k: Tensor, rel_h: Optional[Tensor], rel_w: Optional[Tensor], H: int,
                 W: int, lse: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Softmax probabilities ``[B, Nh, n, HW]`` of a block ``q`` of ``n`` queries ``[B, Nh, n, d]`` over the keys
    ``k`` ``[B, Nh, HW, d]``, and their log-sum-exp ``[B, Nh, n]`` (``lse``: known, in the backward)."""
    logits = _add_relative(q @ k.transpose(-1, -2), rel_h, rel_w, H, W)  # [B, Nh, n, HW]
    if lse is None:
        lse = torch.logsumexp(logits, -1)
    return logits.sub_(lse.unsqueeze(-1)).exp_(), lse


class _BlockedAttention(torch.autograd.Function):
    """Exact attention one query block at a time, flash-style (Dao et al., 2022): the forward keeps the
    output and each query's log-sum-exp; the backward recomputes each block, ``dS = P * (dP - rowsum(dO * O))``.
    """

    @staticmethod
    def forward(ctx, q, k, v, rel_h, rel_w, H, W, rows):
        outs, lses = [], []
        for start in range(0, q.shape[2], rows):
            sl = slice(start, start + rows)
            p, lse = _block_probs(q[:, :, sl], k, _rows(rel_h, sl), _rows(rel_w, sl), H, W)  # [B, Nh, n, HW]
            outs.append(p @ v)
            lses.append(lse)
        out, lse = torch.cat(outs, 2), torch.cat(lses, 2)  # [B, Nh, HW, dv], [B, Nh, HW]
        ctx.save_for_backward(q, k, v, rel_h, rel_w, out, lse)
        ctx.H, ctx.W, ctx.rows = H, W, rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        with torch.autocast(grad_out.device.type, enabled=False):  # float32, as the forward
            q, k, v, rel_h, rel_w, out, lse = ctx.saved_tensors
            H, W, rows = ctx.H, ctx.W, ctx.rows
            B, Nh, N, _ = q.shape
            delta = (grad_out * out).sum(-1)  # [B, Nh, HW]: rowsum(dO * O) = rowsum(P * dP)
            dk = dv = None
            dqs, d_rel_hs, d_rel_ws = [], [], []
            for start in range(0, N, rows):
                sl = slice(start, start + rows)
                p, _ = _block_probs(q[:, :, sl], k, _rows(rel_h, sl), _rows(rel_w, sl), H, W, lse[:, :, sl])
                dv_block = p.transpose(-1, -2) @ grad_out[:, :, sl]  # [B, Nh, HW, dv]
                dv = dv_block if dv is None else dv.add_(dv_block)
                ds = (grad_out[:, :, sl] @ v.transpose(-1, -2)).sub_(delta[:, :, sl, None]).mul_(p)  # [B, Nh, n, HW]
                dqs.append(ds @ k)
                dk_block = ds.transpose(-1, -2) @ q[:, :, sl]  # [B, Nh, HW, d]
                dk = dk_block if dk is None else dk.add_(dk_block)
                if rel_h is not None:
                    ds = ds.view(B, Nh, -1, H, W)
                    d_rel_hs.append(ds.sum(-1))  # [B, Nh, n, H]
                    d_rel_ws.append(ds.sum(-2))  # [B, Nh, n, W]
            d_rel_h, d_rel_w = (torch.cat(d_rel_hs, 2), torch.cat(d_rel_ws, 2)) if rel_h is not None else (None, None)
            return torch.cat(dqs, 2), dk, dv, d_rel_h, d_rel_w, None, None, None


def _rows(t: Optional[Tensor], sl: slice) -> Optional[Tensor]:
    return None if t is None else t[:, :, sl]


def attention_blocked(q: Tensor, k: Tensor, v: Tensor, rel_h: Optional[Tensor], rel_w: Optional[Tensor], H: int,
                      W: int, block_elems: int = CPU_BLOCK_ELEMS) -> Tensor:
    """Exact attention over query blocks of at most ``block_elems`` logits (at least one query row).

    :func:`attention_materialized` when all logits fit in one block, else :class:`_BlockedAttention`
    (peak memory ``O(HW * (d + H + W) + block_elems)`` in both passes).
    """
    B, Nh, N, _ = q.shape
    rows = max(1, block_elems // max(1, B * Nh * N))
    if rows >= N:
        return attention_materialized(q, k, v, rel_h, rel_w, H, W)
    return _BlockedAttention.apply(q, k, v, rel_h, rel_w, H, W, rows)  # [B, Nh, HW, dv]


def attention_sdpa_folded(q: Tensor, k: Tensor, v: Tensor, table_h: Optional[Tensor], table_w: Optional[Tensor],
                          H: int, W: int, dtype: torch.dtype, scale: float = 1.0) -> Tensor:
    """Relative logits folded into one fused ``scaled_dot_product_attention``.

    ``[q, S^H_i, S^W_i] . [k, onehot(h_j), onehot(w_j)] = q.k + rel_h[h_j] + rel_w[w_j]`` exactly, with
    ``H + W`` extra head dims (zero-padded to a multiple of 8). The query side is one GEMM and one gather
    (:func:`folded_queries`), the key side one concatenation with constant columns (:func:`_fold_columns`).

    Args:
        q, k, v, H, W: as :func:`attention_materialized`; ``q`` unscaled when ``scale`` is given.
        table_h, table_w (Tensor | None): ``[2M - 1, d]`` relative embeddings (float32 under AMP), or None.
        dtype (torch.dtype): the fused kernel's dtype. With float16 the relative logits are folded as ``rel / s``
            against one-hot columns of ``s`` (:func:`_fp16_fold_scale`).
        scale (float): every logit's factor, applied inside the fused kernel. Defaults to 1.0.

    Returns:
        Tensor: ``[B, Nh, HW, dv]`` in ``dtype``.
    """
    B, Nh, N, d = q.shape
    dv = v.shape[-1]
    # The fused (memory-efficient) kernels need every head dim in multiples of 8, values'
    # too; otherwise SDPA silently falls back to the math kernel, which stores all logits.
    v = _pad_last(v.to(dtype))  # zeros add nothing to the output's first dv columns
    if table_h is None:
        q, k = _pad_last(q.to(dtype)), _pad_last(k.to(dtype))  # nor to q . k
    else:
        pad = (8 - (d + H + W) % 8) % 8  # not -(d + H + W) % 8: _pad_last says why
        if graph_mode():  # 8 to 15 zero columns: a symbolic size that may be 0 or 1 is guarded, one graph per case
            pad += 8
        columns = size_constant(_fold_columns, H, W, pad, dtype, q.device)  # [H, W, H + W + pad]: one-hot h_j, w_j
        q, fold = folded_queries(q, table_h, table_w, H, W, pad, dtype)  # [B, Nh, HW, d + H + W + pad]
        if fold is not None:
            columns = columns * fold  # a 0-d float32 factor: still float16
        k = torch.cat([k.to(dtype), columns.view(1, 1, N, -1).expand(B, Nh, N, -1)], dim=-1)
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out[..., :dv]


def folded_queries(q: Tensor, table_h: Tensor, table_w: Tensor, H: int, W: int, pad: int,
                   dtype: torch.dtype) -> Tensor:
    """The query side of :func:`attention_sdpa_folded`: ``[q_i, S^H_i, S^W_i, 0]`` per query.

    ``q @ [I, R_h^T, R_w^T, 0]`` is every query's dot product with every table row (and the query itself);
    one gather (:func:`_fold_index`) then reads, for query ``(h_i, w_i)``, the rows of offsets ``h - h_i``
    and ``w - w_i``: eq. (3)'s ``S^H`` and ``S^W`` without a copy per axis.

    Args:
        q (Tensor): ``[B, Nh, HW, d]`` (any layout).
        table_h, table_w (Tensor): ``[2M - 1, d]``.
        H, W (int): the map; pad (int): zero columns after the relative logits.
        dtype (torch.dtype): the GEMM's (``q`` and the tables are cast to it). In float16 the tables are divided
            by :func:`_fp16_fold_scale`'s ``s`` first: the relative logits come as ``rel / s``, in float16's range.

    Returns:
        tuple[Tensor, Tensor | None]: ``[B, Nh, HW, d + H + W + pad]`` in ``dtype``, and ``s`` (0-d) or None.
    """
    B, Nh, N, d = q.shape
    weight = torch.cat([size_constant(eye, d, d, table_h.dtype, q.device), table_h, table_w,
                        size_constant(torch.zeros, 1, d, dtype=table_h.dtype, device=q.device)])  # [C, d]
    fold = _fp16_fold_scale(q, weight) if dtype == torch.float16 else None
    if fold is not None:
        weight = weight / torch.where(size_constant(_relative_rows, d, weight.shape[0], q.device), fold, 1.0)
    products = F.linear(packed(q, dtype), weight.to(dtype))  # [B, Nh, HW, C]
    index = size_constant(_fold_index, H, W, d, table_h.shape[0], table_w.shape[0], pad, q.device)  # [HW, D]
    return _gather(products, index.expand(B, Nh, N, -1)), fold


def _gather(t: Tensor, index: Tensor) -> Tensor:
    """``t.gather(-1, index)`` whose backward holds ``t``'s size, not ``t``: autograd saves a gather's whole input
    for its size, here :func:`folded_queries`' products, several times the folded queries' size."""
    if graph_mode() or not t.requires_grad:  # a captured graph saves only what its backward reads
        return t.gather(-1, index)
    input_ref = weakref.ref(t)  # the saved hooks live as long as the backward: they hold no reference to t
    with torch.autograd.graph.saved_tensors_hooks(
            lambda saved: (saved.shape, saved.dtype, saved.device) if saved is input_ref() else saved,
            lambda held: torch.empty((), dtype=held[1], device=held[2]).expand(held[0])
            if isinstance(held, tuple) else held):
        return t.gather(-1, index)


def _pad_last(t: Tensor) -> Tensor:
    """Zero-pad the last dim of ``t`` to a multiple of 8: one concatenation with a cached zero (one CUDA kernel)."""
    # -n % 8 is the same number, but torch 2.4 - 2.5's inductor bounds it as empty (ValueRangeError)
    # where n is symbolic: their dynamo makes a module's int attributes (num_heads) symbolic with dynamic=True
    pad = (8 - t.shape[-1] % 8) % 8
    return torch.cat([t, size_constant(torch.zeros, pad, dtype=t.dtype, device=t.device).expand(*t.shape[:-1], pad)],
                     -1) if pad else t


def _fold_index(H: int, W: int, d: int, rows_h: int, rows_w: int, pad: int, device) -> Tensor:
    """Columns of :func:`folded_queries`' products each query reads: ``[HW, d + H + W + pad]`` long.

    Its own ``d`` columns, then ``d + relative_index(H)[h_i]``, ``d + rows_h + relative_index(W)[w_i]``,
    then the zero column ``pad`` times.
    """
    own = torch.arange(d, device=device).expand(H, W, d)
    ih = (relative_index(H, (rows_h + 1) // 2, device) + d)[:, None].expand(H, W, H)  # [H (h_i), W, H (h_j)]
    iw = (relative_index(W, (rows_w + 1) // 2, device) + d + rows_h).expand(H, W, W)  # [H, W (w_i), W (w_j)]
    zero = torch.full((H, W, pad), d + rows_h + rows_w, dtype=torch.long, device=device)
    return torch.cat([own, ih, iw, zero], -1).view(H * W, -1)


def _relative_rows(d: int, rows: int, device) -> Tensor:
    """``[rows, 1]`` bool: :func:`folded_queries`' weight rows after the identity's ``d``."""
    return (torch.arange(rows, device=device) >= d)[:, None]


def _fold_columns(H: int, W: int, pad: int, dtype: torch.dtype, device) -> Tensor:
    """The key side's folded columns ``[H, W, H + W + pad]``: ``onehot(h_j)``, ``onehot(w_j)``,
    ``pad`` zeros; a constant of the map size (:func:`size_constant`)."""
    one_h = eye(H, H, dtype, device)[:, None, :].expand(H, W, H)  # [H (h_j), W, H]
    one_w = eye(W, W + pad, dtype, device).expand(H, W, W + pad)  # [H, W (w_j), W + pad]
    return torch.cat([one_h, one_w], dim=-1)


def _fp16_fold_scale(q: Tensor, weight: Tensor) -> Tensor:
    """The power of two ``s`` in ``[1, 2^15]`` with ``|q_i . w_c| / s <= 2^14`` and ``|w| / s <= 2^14`` for every query
    and weight row, from the bound ``max(d max |q|, 1) max |w|`` (no logit computed first), as a 0-d tensor."""
    q_max = torch.linalg.vector_norm(q.detach(), float('inf'), dtype=torch.promote_types(q.dtype, torch.float32))
    w_max = torch.linalg.vector_norm(weight.detach(), float('inf'))
    bound = (q_max * (q.shape[-1] / 2 ** 14)).clamp(min=2 ** -14) * w_max  # that bound / 2^14
    return torch.exp2(torch.frexp(bound).exponent.clamp(0, 15))  # bound < 2^exponent


def relative_attention(q: Tensor, k: Tensor, v: Tensor, table_h: Optional[Tensor], table_w: Optional[Tensor],
                       H: int, W: int, impl: str = 'auto', block_elems: int = CPU_BLOCK_ELEMS,
                       scale: float = 1.0) -> Tensor:
    """Multi-head 2D relative self-attention, eq. (3); kernel and dtype by :mod:`.kernel_policy`.

    Args:
        q (Tensor): ``[B, Nh, HW, d]`` queries, scaled by ``d ** -0.5`` here or by ``scale``.
        k (Tensor): ``[B, Nh, HW, d]`` keys.
        v (Tensor): ``[B, Nh, HW, dv]`` values.
        table_h, table_w (Tensor | None): ``[2M - 1, d]`` relative embeddings, or None (no position).
        H, W (int): spatial size, ``H * W == HW``.
        impl (str): 'auto' (:func:`choose_impl`), 'blocked', 'sdpa' or 'materialized'.
            Defaults to 'auto'.
        block_elems (int): logits held at once by 'blocked'.
        scale (float): the logits' factor: ``d ** -0.5`` for unscaled ``q``, 1.0 for ``q`` already scaled.
            Defaults to 1.0.

    Returns:
        Tensor: ``[B, Nh, HW, dv]`` in the dtype of ``v``.
    """
    if impl not in IMPLS:
        raise ValueError(f'impl must be one of {IMPLS}, got {impl!r}')
    device, amp_dtype = kernel_device(q.device.type), autocast_dtype(q.device.type)
    if impl == 'auto':
        B, Nh, N, _ = q.shape
        impl = choose_impl(device, B * Nh * N * N, amp_dtype)
    dtype = kernel_dtype(device, impl, q.dtype, amp_dtype)
    with torch.autocast(q.device.type, enabled=False):
        if impl == 'sdpa':
            return attention_sdpa_folded(q, k, v, table_h, table_w, H, W, dtype, scale).to(v.dtype)
        q = q * scale if scale != 1.0 else q
        rel_h = rel_w = None
        if table_h is not None:  # in float32 (float64 in tests), whatever the kernel's dtype
            rel_dtype = torch.promote_types(q.dtype, torch.float32)
            rel_h, rel_w = relative_logits(q.view(*q.shape[:2], H, W, q.shape[-1]), table_h.to(rel_dtype),
                                           table_w.to(rel_dtype))
        args = (q.to(dtype), k.to(dtype), v.to(dtype), rel_h, rel_w, H, W)
        out = attention_blocked(*args, block_elems) if impl == 'blocked' else attention_materialized(*args)
    return out.to(v.dtype)
