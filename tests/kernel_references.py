"""Loop references written straight from the papers' equations: the float64
oracles every fast attention kernel is tested against (AA eq. (3); GSA eq. (1),
(5)-(7)). Slow; tests only."""
from typing import Optional

import torch
from torch import Tensor


def attention_reference(q: Tensor, k: Tensor, v: Tensor,
                        table_h: Optional[Tensor], table_w: Optional[Tensor],
                        H: int, W: int) -> Tensor:
    """Eq. (3) with explicit loops over query and key positions. Slow; the
    float64 oracle of every AA kernel.

    Args:
        q, k (Tensor): ``[B, Nh, HW, d]``, ``q`` already scaled.
        v (Tensor): ``[B, Nh, HW, dv]``.
        table_h, table_w (Tensor | None): relative tables, or None for no
            position term.

    Returns:
        Tensor: ``[B, Nh, HW, dv]``.
    """
    out = torch.zeros(
        q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    for i in range(H * W):
        hi, wi = divmod(i, W)
        logits = []
        for j in range(H * W):
            hj, wj = divmod(j, W)
            logit = (q[:, :, i] * k[:, :, j]).sum(-1)
            if table_h is not None:
                mh, mw = (table_h.shape[0] + 1) // 2, (table_w.shape[0] +
                                                       1) // 2
                dh = max(-(mh - 1), min(mh - 1, hj - hi)) + mh - 1
                dw = max(-(mw - 1), min(mw - 1, wj - wi)) + mw - 1
                logit = logit + (q[:, :, i] * table_h[dh]).sum(-1) + (
                    q[:, :, i] * table_w[dw]).sum(-1)
            logits.append(logit)
        weights = torch.stack(logits, -1).softmax(-1)  # [B, Nh, HW]
        out[:, :, i] = torch.einsum('bnj,bnjd->bnd', weights, v)
    return out


def flex_attention_dense(q: Tensor,
                         k: Tensor,
                         v: Tensor,
                         rel: Optional[Tensor],
                         rows_h: int,
                         scale: float,
                         rel_scale: Optional[float] = None) -> Tensor:
    """FlexAttention's math, differentiable on the CPU (where FlexAttention has
    no backward): every score of ``scale q k^T``, the layer's ``score_mod``
    applied elementwise on broadcast index grids, softmax, ``@ v``. A stand-in
    for ``aa_conv.attention_flex`` (same arguments) whose gradients reach
    ``rel``."""
    from aa_det.models.layers.aa_conv import relative_score_mod
    B, Nh, N, _ = q.shape
    score = (q @ k.transpose(-1, -2)).float(
    ) * scale if q.dtype != torch.float64 else q @ k.transpose(-1, -2) * scale
    if rel is not None:
        b, n = torch.arange(B)[:, None, None,
                               None], torch.arange(Nh)[None, :, None, None]
        i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
        # [B, Nh, N (i), N (j)]
        score = relative_score_mod(
            rel, rows_h, scale if rel_scale is None else rel_scale)(score, b,
                                                                    n, i, j)
    return score.softmax(-1).to(v.dtype) @ v


def gsa_reference(q: Tensor,
                  k: Tensor,
                  v: Tensor,
                  table_col: Tensor,
                  table_row: Tensor,
                  norm=None) -> Tensor:
    """Content + column->norm->row attention with explicit loops over pixels.

    Slow and written straight from the GSA paper's equations; the float64
    oracle of the GSA kernels.
    """
    B, Nh, dk, H, W = q.shape
    mc, mr = (table_col.shape[0] + 1) // 2, (table_row.shape[0] + 1) // 2

    def clip(off, m):
        return max(-(m - 1), min(m - 1, off)) + m - 1

    ksoft = k.reshape(B, Nh, dk, H * W).softmax(-1).reshape(k.shape)
    content = torch.zeros(v.shape, dtype=v.dtype)
    col = torch.zeros(v.shape, dtype=v.dtype)
    for x in range(H):
        for y in range(W):
            for i in range(H):
                for j in range(W):
                    # [B, Nh, 1]
                    w = (q[:, :, :, x, y] * ksoft[:, :, :, i, j]).sum(
                        2, keepdim=True)
                    content[:, :, :, x, y] += w * v[:, :, :, i, j]
            for i in range(H):
                s = (q[:, :, :, x, y] * table_col[clip(i - x, mc)]).sum(
                    2, keepdim=True)
                col[:, :, :, x, y] += s * v[:, :, :, i, y]
    if norm is not None:
        col = norm(col.reshape(B, -1, H, W)).reshape(col.shape)
    row = torch.zeros(v.shape, dtype=v.dtype)
    for x in range(H):
        for y in range(W):
            for j in range(W):
                s = (q[:, :, :, x, y] * table_row[clip(j - y, mr)]).sum(
                    2, keepdim=True)
                row[:, :, :, x, y] += s * col[:, :, :, x, j]
    return content + row


def gsa_qkv(gsa, x: Tensor):
    """``q, k`` ``[B, Nh, dkh, H, W]`` and ``v`` ``[B, Nh, dvh, H, W]`` of a
    GSA module's input ``x`` (its qkv convolution, split per head), as
    :func:`gsa_reference` reads them."""
    B, _, H, W = x.shape
    q, k, v = gsa.qkv(x).split(
        [gsa.key_channels, gsa.key_channels, gsa.out_channels], 1)
    return tuple(t.reshape(B, gsa.num_heads, -1, H, W) for t in (q, k, v))
