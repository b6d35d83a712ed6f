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
* :func:`attention_blocked` - query blocks whose logits are recomputed in the
  backward pass (activation checkpointing), so peak memory grows linearly in HW.
  Default on the CPU, where ``flex_attention`` has no backward and SDPA with an
  additive bias materialises the bias.
* :func:`attention_sdpa_folded` - the relative tables are folded into plain
  dot-product attention (``q' = [q, rel_h, rel_w]``, ``k' = [k, onehot(h_j),
  onehot(w_j)]``), which fused CUDA kernels accept; default on CUDA when the
  logits exceed one block (:func:`choose_impl`).
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

#: Default bound on ``B * Nh * queries * keys`` logits held at once (64 MiB in fp32).
DEFAULT_BLOCK_ELEMS = 1 << 24


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
    shape = logits.shape
    logits = logits.view(*shape[:-1], H, W) + rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)
    return logits.view(shape)


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


def attention_blocked(q: Tensor, k: Tensor, v: Tensor, rel_h: Optional[Tensor],
                      rel_w: Optional[Tensor], H: int, W: int,
                      block_elems: int = DEFAULT_BLOCK_ELEMS) -> Tensor:
    """Exact attention over query blocks of at most ``block_elems`` logits.

    When all logits fit in one block this is :func:`attention_materialized`.
    Otherwise each query block is wrapped in activation checkpointing: its
    logits live only while the block is computed, in the forward and again in
    the backward pass, so peak memory is ``O(HW * (d + H + W) + block_elems)``.
    """
    B, Nh, N, _ = q.shape
    rows = max(1, block_elems // max(1, B * Nh * N))
    if rows >= N:
        return attention_materialized(q, k, v, rel_h, rel_w, H, W)
    outs = []
    for start in range(0, N, rows):
        sl = slice(start, start + rows)
        args = (q[:, :, sl], k, v, None if rel_h is None else rel_h[:, :, sl],
                None if rel_w is None else rel_w[:, :, sl], H, W)
        if torch.is_grad_enabled():
            outs.append(checkpoint(attention_materialized, *args, use_reentrant=False))
        else:
            outs.append(attention_materialized(*args))
    return torch.cat(outs, dim=2)  # [B, Nh, HW, dv]


def attention_sdpa_folded(q: Tensor, k: Tensor, v: Tensor, rel_h: Optional[Tensor],
                          rel_w: Optional[Tensor], H: int, W: int) -> Tensor:
    """Relative logits folded into one fused ``scaled_dot_product_attention``.

    ``[q, rel_h, rel_w] . [k, onehot(h_j), onehot(w_j)] = q.k + rel_h[h_j] + rel_w[w_j]``
    exactly, at the cost of ``H + W`` extra head dimensions; the fused kernels
    never store the logits.
    """
    if rel_h is not None:
        N = H * W
        rows = torch.arange(N, device=q.device) // W
        cols = torch.arange(N, device=q.device) % W
        one_h = F.one_hot(rows, H).to(k.dtype).expand(*k.shape[:2], N, H)  # [B, Nh, HW, H]
        one_w = F.one_hot(cols, W).to(k.dtype).expand(*k.shape[:2], N, W)  # [B, Nh, HW, W]
        q = torch.cat([q, rel_h, rel_w], dim=-1)  # [B, Nh, HW, d + H + W]
        k = torch.cat([k, one_h, one_w], dim=-1)
    # The fused (memory-efficient) kernels need every head dim in multiples of 8, values'
    # too; otherwise SDPA silently falls back to the math kernel, which stores all logits.
    q, k = _pad_last(q, 8), _pad_last(k, 8)  # zeros add nothing to q . k
    dv = v.shape[-1]
    out = F.scaled_dot_product_attention(q, k, _pad_last(v, 8), scale=1.0)
    return out[..., :dv]


def _pad_last(t: Tensor, multiple: int) -> Tensor:
    """Zero-pad the last dim of ``t`` up to a multiple of ``multiple``."""
    pad = -t.shape[-1] % multiple
    return F.pad(t, (0, pad)) if pad else t


def choose_impl(device_type: str, num_logits: int, block_elems: int = DEFAULT_BLOCK_ELEMS) -> str:
    """The fastest exact kernel for ``num_logits = B * Nh * (HW)^2`` on a device.

    * CPU: 'blocked' (one materialised block when the logits fit, query blocks
      under checkpointing otherwise): no fused kernel has a backward there.
    * CUDA: 'blocked' too while all logits fit in one block (small maps such as
      ImageNet's 14x14 and 7x7), where the plain matmuls beat the folded kernel's
      ``H + W`` extra head dims (H100, RetinaNet AA-R50 at 640x640: 0.085 s per step
      materialised vs 0.114 s folded); above that 'sdpa', whose fused kernel
      never stores the logits (one 8-head layer at 128x128: 0.8 GiB vs 32 GiB).
    """
    if device_type == 'cuda' and num_logits > block_elems:
        return 'sdpa'
    return 'blocked'


def relative_attention(q: Tensor, k: Tensor, v: Tensor, table_h: Optional[Tensor],
                       table_w: Optional[Tensor], H: int, W: int,
                       impl: str = 'auto',
                       block_elems: int = DEFAULT_BLOCK_ELEMS) -> Tensor:
    """Multi-head 2D relative self-attention, eq. (3), in float32 under autocast.

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
    if impl == 'auto':
        B, Nh, N, _ = q.shape
        impl = choose_impl(q.device.type, B * Nh * N * N, block_elems)
    # Logits and softmax in float32 even under fp16/bf16 autocast (fp16 overflow).
    dtype = torch.promote_types(q.dtype, torch.float32)  # float64 stays float64 (tests)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if table_h is not None:
            table_h, table_w = table_h.to(dtype), table_w.to(dtype)
        if impl == 'reference':
            out = attention_reference(q, k, v, table_h, table_w, H, W)
        else:
            rel_h = rel_w = None
            if table_h is not None:
                rel_h, rel_w = relative_logits_2d(
                    q.view(*q.shape[:2], H, W, q.shape[-1]), table_h, table_w)
            if impl == 'blocked':
                out = attention_blocked(q, k, v, rel_h, rel_w, H, W, block_elems)
            elif impl == 'sdpa':
                out = attention_sdpa_folded(q, k, v, rel_h, rel_w, H, W)
            elif impl == 'materialized':
                out = attention_materialized(q, k, v, rel_h, rel_w, H, W)
            else:
                raise ValueError(f"impl must be 'auto', 'blocked', 'sdpa', 'materialized' or "
                                 f"'reference', got {impl!r}")
    return out.to(out_dtype)


def init_relative_table(table: Tensor, head_dim: int) -> Tensor:
    """Initialise a relative table with N(0, head_dim ** -0.5) (AA paper, Sec. 3.2)."""
    with torch.no_grad():
        return table.normal_(0.0, math.pow(head_dim, -0.5))
