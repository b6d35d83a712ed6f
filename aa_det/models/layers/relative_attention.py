"""Exact 2D relative multi-head self-attention without (HW)x(HW) logits per head.

Bello et al., *Attention Augmented Convolutional Networks*, ICCV 2019, eq. (3)::

    logit(i, j) = q_i . k_j + q_i . r^H[h_j - h_i] + q_i . r^W[w_j - w_i]

with ``q`` already scaled by ``dkh ** -0.5`` (as the paper's appendix code does).
Both relative terms depend on the key only through its row ``h_j`` or its column
``w_j``, so per query they are tables of ``H`` and ``W`` numbers
(:func:`relative_logits_2d`). The attention kernels below take those tables and
add them to the content logits by broadcasting, one bounded block of queries at
a time, so no function here holds ``B * Nh * (HW)^2`` numbers unless that is
within ``block_elems``.

Embedding tables are not tied to an input size: a table of ``2 * max_dist - 1``
rows covers offsets ``-(max_dist - 1) .. max_dist - 1`` and larger offsets are
clipped to the ends (Shaw et al., 2018), so the same weights serve 7x7 and 100x160
feature maps. Within ``max_dist`` the result equals the paper's per-size tables.

Four exact implementations of one function; `relative_attention` picks one:

* :func:`attention_reference` - loops straight from eq. (3); slow, for tests.
* :func:`attention_materialized` - the paper's form: all logits at once.
* :func:`attention_blocked` - query blocks; the forward keeps each query's
  log-sum-exp and the backward recomputes one block of logits at a time
  (flash-attention style), so peak memory grows linearly in HW.
  Default on the CPU, where ``flex_attention`` has no backward and SDPA with an
  additive bias materialises the bias.
* :func:`attention_sdpa_folded` - the relative tables are folded into plain
  dot-product attention (``q' = [q, rel_h, rel_w]``, ``k' = [k, onehot(h_j),
  onehot(w_j)]``), which fused CUDA kernels accept; default on CUDA for large
  maps, and at every size under fp16 / bf16 autocast (:func:`choose_impl`).

Precision (:func:`kernel_dtype`): every kernel computes in float32 (float64
inputs stay float64), except the fused one on CUDA under autocast, which takes
the autocast dtype: its logits, softmax and accumulation stay float32 inside the
kernel (as PyTorch's own SDPA under AMP), so low-precision inputs bring tensor
cores without the fp16 overflow of materialised fp16 logits.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...utils.compat import autocast_dtype

#: Default bound on ``B * Nh * queries * keys`` logits held at once (16 MiB in fp32). Small
#: blocks are also the fast choice on the CPU (cache-sized, and below glibc's mmap threshold,
#: so reused instead of page-faulted in afresh): 1.3-2x faster than 64 MiB blocks. A smaller
#: bound would make small maps (20x20, batch 2) pay the blocked backward's recomputation.
DEFAULT_BLOCK_ELEMS = 1 << 22
#: On CUDA, logits up to this many are materialised at once (64 MiB in fp32), see choose_impl.
CUDA_MATERIALIZE_ELEMS = 1 << 24


def relative_index(length: int, max_dist: int, device=None) -> Tensor:
    """Index into a ``2 * max_dist - 1`` row table for every (query, key) pair.

    Returns:
        Tensor: ``[length, length]`` long, ``idx[a, b] = clip(b - a) + max_dist - 1``.
    """
    pos = torch.arange(length, device=device)
    offset = (pos[None, :] - pos[:, None]).clamp(-(max_dist - 1), max_dist - 1)
    return offset + max_dist - 1


def relative_logits_2d(q: Tensor, table_h: Tensor, table_w: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-query relative logits along height and width (eq. (3), S^H and S^W).

    Args:
        q (Tensor): ``[B, Nh, H, W, d]`` scaled queries.
        table_h (Tensor): ``[2 * Mh - 1, d]`` height embeddings.
        table_w (Tensor): ``[2 * Mw - 1, d]`` width embeddings.

    Returns:
        tuple[Tensor, Tensor]: ``rel_h`` ``[B, Nh, HW, H]`` with
        ``rel_h[.., i, h] = q_i . r^H[h - h_i]`` and ``rel_w`` ``[B, Nh, HW, W]``.
    """
    B, Nh, H, W, d = q.shape
    emb_h = table_h[relative_index(H, (table_h.shape[0] + 1) // 2, q.device)]  # [H, H, d]
    emb_w = table_w[relative_index(W, (table_w.shape[0] + 1) // 2, q.device)]  # [W, W, d]
    rel_h = torch.einsum('bnhwd,hkd->bnhwk', q, emb_h).reshape(B, Nh, H * W, H)
    rel_w = torch.einsum('bnhwd,wkd->bnhwk', q, emb_w).reshape(B, Nh, H * W, W)
    return rel_h, rel_w


def attention_reference(q: Tensor, k: Tensor, v: Tensor, table_h: Optional[Tensor],
                        table_w: Optional[Tensor], H: int, W: int) -> Tensor:
    """Eq. (3) with explicit loops over query and key positions. Slow; tests only.

    Args:
        q, k (Tensor): ``[B, Nh, HW, d]``, ``q`` already scaled.
        v (Tensor): ``[B, Nh, HW, dv]``.
        table_h, table_w (Tensor | None): relative tables, or None for no
            position term.

    Returns:
        Tensor: ``[B, Nh, HW, dv]``.
    """
    out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    for i in range(H * W):
        hi, wi = divmod(i, W)
        logits = []
        for j in range(H * W):
            hj, wj = divmod(j, W)
            logit = (q[:, :, i] * k[:, :, j]).sum(-1)
            if table_h is not None:
                mh, mw = (table_h.shape[0] + 1) // 2, (table_w.shape[0] + 1) // 2
                dh = max(-(mh - 1), min(mh - 1, hj - hi)) + mh - 1
                dw = max(-(mw - 1), min(mw - 1, wj - wi)) + mw - 1
                logit = logit + (q[:, :, i] * table_h[dh]).sum(-1) + (q[:, :, i] * table_w[dw]).sum(-1)
            logits.append(logit)
        weights = torch.stack(logits, -1).softmax(-1)  # [B, Nh, HW]
        out[:, :, i] = torch.einsum('bnj,bnjd->bnd', weights, v)
    return out


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
        rel_h, rel_w (Tensor | None): from :func:`relative_logits_2d`.

    Returns:
        Tensor: ``[B, Nh, HW, dv]``.
    """
    logits = _add_relative(q @ k.transpose(-1, -2), rel_h, rel_w, H, W)  # [B, Nh, HW, HW]
    return logits.softmax(-1) @ v


def _block_probs(q: Tensor, k: Tensor, rel_h: Optional[Tensor], rel_w: Optional[Tensor], H: int,
                 W: int, lse: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Softmax probabilities of one query block and their log-sum-exp.

    Args:
        q (Tensor): ``[B, Nh, n, d]`` a block of ``n`` queries; k (Tensor): ``[B, Nh, HW, d]``.
        lse (Tensor | None): ``[B, Nh, n]`` known log-sum-exp (backward), else computed.

    Returns:
        tuple[Tensor, Tensor]: ``[B, Nh, n, HW]`` probabilities and ``[B, Nh, n]`` lse.
    """
    logits = _add_relative(q @ k.transpose(-1, -2), rel_h, rel_w, H, W)  # [B, Nh, n, HW]
    if lse is None:
        lse = torch.logsumexp(logits, -1)
    return logits.sub_(lse.unsqueeze(-1)).exp_(), lse


class _BlockedAttention(torch.autograd.Function):
    """Exact attention one query block at a time, flash-style (Dao et al., 2022).

    The forward keeps only the output and each query's log-sum-exp; the backward
    recomputes one block of probabilities at a time and uses
    ``dS = P * (dP - rowsum(dO * O))``. Only ``rows`` query rows of logits exist at
    any moment, in either pass (with their probabilities and, in the backward, their
    gradient: a few blocks of ``B * Nh * rows * HW`` numbers).
    """

    @staticmethod
    def forward(ctx, q, k, v, rel_h, rel_w, H, W, rows):
        B, Nh, N, _ = q.shape
        out = v.new_empty(B, Nh, N, v.shape[-1])  # [B, Nh, HW, dv]
        lse = q.new_empty(B, Nh, N)
        for sl in chunks(N, rows):
            p, lse[:, :, sl] = _block_probs(q[:, :, sl], k, _rows(rel_h, sl), _rows(rel_w, sl), H, W)
            out[:, :, sl] = p @ v
        ctx.save_for_backward(q, k, v, rel_h, rel_w, out, lse)
        ctx.H, ctx.W, ctx.rows = H, W, rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        with torch.autocast(grad_out.device.type, enabled=False):  # float32, as the forward
            return _BlockedAttention._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        q, k, v, rel_h, rel_w, out, lse = ctx.saved_tensors
        H, W, rows = ctx.H, ctx.W, ctx.rows
        B, Nh, N, _ = q.shape
        delta = (grad_out * out).sum(-1)  # [B, Nh, HW]: rowsum(dO * O) = rowsum(P * dP)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        d_rel_h = None if rel_h is None else torch.empty_like(rel_h)  # [B, Nh, HW, H]
        d_rel_w = None if rel_w is None else torch.empty_like(rel_w)  # [B, Nh, HW, W]
        for sl in chunks(N, rows):
            p, _ = _block_probs(q[:, :, sl], k, _rows(rel_h, sl), _rows(rel_w, sl), H, W, lse[:, :, sl])
            dv += p.transpose(-1, -2) @ grad_out[:, :, sl]
            ds = (grad_out[:, :, sl] @ v.transpose(-1, -2)).sub_(delta[:, :, sl, None]).mul_(p)  # [B, Nh, n, HW]
            dq[:, :, sl] = ds @ k
            dk += ds.transpose(-1, -2) @ q[:, :, sl]
            if rel_h is not None:
                ds = ds.view(B, Nh, -1, H, W)
                d_rel_h[:, :, sl], d_rel_w[:, :, sl] = ds.sum(-1), ds.sum(-2)
        return dq, dk, dv, d_rel_h, d_rel_w, None, None, None


def chunks(length: int, size: int):
    """Slices ``[0, size), [size, 2 size), ...`` covering ``range(length)``."""
    return (slice(start, start + size) for start in range(0, length, size))


def _rows(t: Optional[Tensor], sl: slice) -> Optional[Tensor]:
    return None if t is None else t[:, :, sl]


def attention_blocked(q: Tensor, k: Tensor, v: Tensor, rel_h: Optional[Tensor],
                      rel_w: Optional[Tensor], H: int, W: int,
                      block_elems: int = DEFAULT_BLOCK_ELEMS) -> Tensor:
    """Exact attention over query blocks of at most ``block_elems`` logits.

    When all logits fit in one block this is :func:`attention_materialized`.
    Otherwise :class:`_BlockedAttention`: peak memory is
    ``O(HW * (d + H + W) + block_elems)`` in the forward and the backward pass.
    A block holds at least one query row, so ``block_elems`` below ``B * Nh * HW``
    is rounded up to that.
    """
    B, Nh, N, _ = q.shape
    rows = max(1, block_elems // max(1, B * Nh * N))
    if rows >= N:
        return attention_materialized(q, k, v, rel_h, rel_w, H, W)
    return _BlockedAttention.apply(q, k, v, rel_h, rel_w, H, W, rows)  # [B, Nh, HW, dv]


def attention_sdpa_folded(q: Tensor, k: Tensor, v: Tensor, rel_h: Optional[Tensor],
                          rel_w: Optional[Tensor], H: int, W: int,
                          dtype: Optional[torch.dtype] = None) -> Tensor:
    """Relative logits folded into one fused ``scaled_dot_product_attention``.

    ``[q, rel_h, rel_w] . [k, onehot(h_j), onehot(w_j)] = q.k + rel_h[h_j] + rel_w[w_j]``
    exactly, at the cost of ``H + W`` extra head dimensions; the fused kernels
    never store the logits.

    Args:
        q, k, v, rel_h, rel_w, H, W: as :func:`attention_materialized`.
        dtype (torch.dtype, optional): the dtype the fused kernel runs in; defaults to
            ``q``'s. With float16, ``rel_h`` and ``rel_w`` (computed in float32) are folded
            as ``rel / s`` against one-hot columns of ``s``, a power of two chosen on the
            device so that ``|rel / s| <= 2^14``: exact (``s = 1`` unless the relative
            logits leave float16's range) and with no host synchronisation.

    Returns:
        Tensor: ``[B, Nh, HW, dv]`` in ``dtype``.
    """
    dtype = q.dtype if dtype is None else dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if rel_h is not None:
        N = H * W
        scale = _fp16_fold_scale(rel_h, rel_w) if dtype == torch.float16 else None
        one_h = F.one_hot(torch.arange(N, device=q.device) // W, H).to(dtype)  # [HW, H]
        one_w = F.one_hot(torch.arange(N, device=q.device) % W, W).to(dtype)  # [HW, W]
        if scale is not None:
            rel_h, rel_w = rel_h / scale, rel_w / scale
            one_h, one_w = one_h * scale.to(dtype), one_w * scale.to(dtype)
        q = torch.cat([q, rel_h.to(dtype), rel_w.to(dtype)], dim=-1)  # [B, Nh, HW, d + H + W]
        k = torch.cat([k, one_h.expand(*k.shape[:2], N, H), one_w.expand(*k.shape[:2], N, W)], dim=-1)
    # The fused (memory-efficient) kernels need every head dim in multiples of 8, values'
    # too; otherwise SDPA silently falls back to the math kernel, which stores all logits.
    q, k = _pad_last(q, 8), _pad_last(k, 8)  # zeros add nothing to q . k
    dv = v.shape[-1]
    out = F.scaled_dot_product_attention(q, k, _pad_last(v, 8), scale=1.0)
    return out[..., :dv]


def _fp16_fold_scale(rel_h: Tensor, rel_w: Tensor) -> Tensor:
    """The power of two ``s`` in ``[1, 2^15]`` with ``max |rel| / s <= 2^14``, as a 0-d tensor."""
    amax = torch.maximum(rel_h.detach().abs().amax(), rel_w.detach().abs().amax()).float()
    return torch.exp2(torch.log2(amax / 2 ** 14).ceil().clamp(0, 15))


def _pad_last(t: Tensor, multiple: int) -> Tensor:
    """Zero-pad the last dim of ``t`` up to a multiple of ``multiple``."""
    pad = -t.shape[-1] % multiple
    return F.pad(t, (0, pad)) if pad else t


def choose_impl(device_type: str, num_logits: int, amp_dtype: Optional[torch.dtype] = None) -> str:
    """The fastest exact kernel for ``num_logits = B * Nh * (HW)^2`` on a device.

    * CPU: 'blocked', for all sizes and dtypes: no fused kernel has a backward there,
      and its 16 MiB blocks beat the materialised form where both fit (README,
      ``benchmarks/attention_memory.py``).
    * CUDA under fp16 / bf16 autocast (``amp_dtype``): 'sdpa' at every size. The
      fused kernel runs on the low-precision inputs with float32 logits inside;
      the materialised form would need float32 logits, off the tensor cores (an
      H100 one-layer measurement in issue 11: fused fp32 8.8 ms, bf16 1.75 ms).
    * CUDA in float32: 'materialized' while the logits are at most
      ``CUDA_MATERIALIZE_ELEMS`` (64 MiB: small maps such as stage 4 and
      ImageNet's 14x14), where plain matmuls beat the folded kernel's ``H + W``
      extra head dims (H100, RetinaNet AA-R50 at 640x640: 0.085 s per step
      materialised vs 0.114 s folded); above that 'sdpa', whose fused kernel never
      stores the logits (one 8-head layer at 128x128: 0.8 GiB vs 32 GiB).
    """
    if device_type == 'cuda':
        if amp_dtype in (torch.float16, torch.bfloat16):
            return 'sdpa'
        return 'materialized' if num_logits <= CUDA_MATERIALIZE_ELEMS else 'sdpa'
    return 'blocked'


def kernel_dtype(device_type: str, impl: str, input_dtype: torch.dtype,
                 amp_dtype: Optional[torch.dtype] = None) -> torch.dtype:
    """The dtype a kernel computes in.

    float32 (float64 stays float64, for the tests), so that materialised and blocked
    logits and softmax never overflow fp16; the exception is the fused CUDA kernel under
    fp16 / bf16 autocast, which computes its logits in float32 internally and takes the
    autocast dtype (:func:`attention_sdpa_folded` guards the folded relative logits).
    """
    if device_type == 'cuda' and impl == 'sdpa' and amp_dtype in (torch.float16, torch.bfloat16):
        return amp_dtype
    return torch.promote_types(input_dtype, torch.float32)


def relative_attention(q: Tensor, k: Tensor, v: Tensor, table_h: Optional[Tensor],
                       table_w: Optional[Tensor], H: int, W: int,
                       impl: str = 'auto',
                       block_elems: int = DEFAULT_BLOCK_ELEMS) -> Tensor:
    """Multi-head 2D relative self-attention, eq. (3).

    Kernel and precision are chosen per device and autocast dtype
    (:func:`choose_impl`, :func:`kernel_dtype`): float32 everywhere, except the fused
    CUDA kernel under autocast, which runs on the autocast dtype with float32 logits.

    Args:
        q (Tensor): ``[B, Nh, HW, d]`` queries, already scaled by ``d ** -0.5``.
        k (Tensor): ``[B, Nh, HW, d]`` keys.
        v (Tensor): ``[B, Nh, HW, dv]`` values.
        table_h, table_w (Tensor | None): ``[2M - 1, d]`` relative embeddings
            shared by the heads, or None for position-free attention.
        H, W (int): spatial size, ``H * W == HW``.
        impl (str): 'auto' (:func:`choose_impl`), 'blocked',
            'sdpa', 'materialized' or 'reference'. Defaults to 'auto'.
        block_elems (int): logits held at once by 'blocked'.

    Returns:
        Tensor: ``[B, Nh, HW, dv]`` in the dtype of ``v``.
    """
    out_dtype = v.dtype
    device = q.device.type
    amp_dtype = autocast_dtype(device)
    if impl == 'auto':
        B, Nh, N, _ = q.shape
        impl = choose_impl(device, B * Nh * N * N, amp_dtype)
    dtype = kernel_dtype(device, impl, q.dtype, amp_dtype)
    # the relative logits in float32 (float64 in tests), whatever the kernel's dtype
    rel_dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(device, enabled=False):
        if impl == 'reference':
            tables = (None, None) if table_h is None else (table_h.to(dtype), table_w.to(dtype))
            return attention_reference(q.to(dtype), k.to(dtype), v.to(dtype), *tables, H, W).to(out_dtype)
        rel_h = rel_w = None
        if table_h is not None:
            rel_h, rel_w = relative_logits_2d(q.to(rel_dtype).view(*q.shape[:2], H, W, q.shape[-1]),
                                              table_h.to(rel_dtype), table_w.to(rel_dtype))
        if impl == 'sdpa':
            out = attention_sdpa_folded(q, k, v, rel_h, rel_w, H, W, dtype)
        elif impl in ('blocked', 'materialized'):
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            if impl == 'blocked':
                out = attention_blocked(q, k, v, rel_h, rel_w, H, W, block_elems)
            else:
                out = attention_materialized(q, k, v, rel_h, rel_w, H, W)
        else:
            raise ValueError(f"impl must be 'auto', 'blocked', 'sdpa', 'materialized' or "
                             f"'reference', got {impl!r}")
    return out.to(out_dtype)


def init_relative_table(table: Tensor, head_dim: int) -> Tensor:
    """Initialise a relative table with N(0, head_dim ** -0.5) (AA paper, Sec. 3.2)."""
    with torch.no_grad():
        return table.normal_(0.0, math.pow(head_dim, -0.5))
