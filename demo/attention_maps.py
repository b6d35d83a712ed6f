"""Attention maps of chosen query pixels, for the pictures of
``demo/vis_attention.py`` (AA paper Figs. 10-11).

Computed from a layer's weights on a path of their own: the layers' forward is
neither changed nor slowed by them. ``tests/test_attention_maps.py`` checks
that the maps, applied to the values, reproduce the forward's outputs.

Example:
    >>> import torch
    >>> from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
    >>> queries = torch.tensor([[0, 0], [4, 5]])
    >>> conv = AAConv2d(16, 16, num_heads=2, min_key_dim_per_head=4).eval()
    >>> attention_weights(conv, torch.rand(1, 16, 5, 6),
    ...                   queries)['attention'].shape
    torch.Size([1, 2, 2, 5, 6])
    >>> maps = attention_weights(
    ...     GlobalSelfAttention2d(16, 16, num_heads=2).eval(),
    ...     torch.rand(1, 16, 5, 6), queries)
    >>> {name: tuple(m.shape) for name, m in maps.items()}
    {'content': (1, 2, 2, 5, 6), 'positional': (1, 2, 2, 5, 6)}
"""
import torch
from torch import Tensor

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.models.layers.aa_conv import relative_logits
from aa_det.models.layers.relative_position import relative_embeddings


def attention_weights(layer, x: Tensor, queries: Tensor) -> dict:
    """Per-head attention maps of ``layer`` (an :class:`AAConv2d` or a
    :class:`GlobalSelfAttention2d`) for chosen query positions.

    Args:
        layer (AAConv2d | GlobalSelfAttention2d): an attention layer, usually
            in eval mode.
        x (Tensor): ``[B, C, H, W]``, the layer's input.
        queries (Tensor): ``[P, 2]`` long (row, col) positions on the attention
            grid (AA: ``x``'s size after stride and downsampling; GSA: ``x``'s
            size).

    Returns:
        dict[str, Tensor]: name -> ``[B, Nh, P, h, w]``: ``'attention'`` for AA
        (softmax weights); ``'content'`` and ``'positional'`` for GSA (the
        components it has).
    """
    with torch.no_grad():
        if isinstance(layer, AAConv2d):
            return {'attention': aa_weights(layer, x, queries)}
        if isinstance(layer, GlobalSelfAttention2d):
            return gsa_weights(layer, x, queries)
    raise TypeError(
        f'attention_weights: expected an AAConv2d or a GlobalSelfAttention2d, '
        f'got {type(layer).__name__}')


def aa_weights(conv: AAConv2d, x: Tensor, queries: Tensor) -> Tensor:
    """Softmax weights of AA eq. (3) for ``queries``: ``[B, Nh, P, h, w]`` in
    float32."""
    # [B, Nh, hw, dkh]
    q, k, _, (h, w) = conv.qkv_heads(conv.attention_input(x))
    q = q * conv.scale
    idx = queries[:, 0] * w + queries[:, 1]
    logits = q[:, :, idx] @ k.transpose(-1, -2)  # [B, Nh, P, hw]
    if conv.position == 'relative':
        table_h, table_w = conv.relative_tables(h, w)
        rel_h, rel_w = relative_logits(
            q.unflatten(2, (h, w)),
            *relative_embeddings([table_h, table_w], [h, w]))
        logits = (logits.view(*logits.shape[:3], h, w) +
                  rel_h[:, :, idx, :, None] +
                  rel_w[:, :, idx, None, :]).flatten(-2)
    return logits.float().softmax(-1).view(*logits.shape[:3], h, w)


def gsa_weights(gsa: GlobalSelfAttention2d, x: Tensor,
                queries: Tensor) -> dict:
    """GSA's maps for ``queries``, ``[B, Nh, P, H, W]`` each:

    * ``content``: weight of pixel ``j`` in query ``i``'s output,
      ``q_i . softmax_positions(K)_j`` (eq. (1); not normalised, may be < 0).
    * ``positional``: column then row weights composed,
      ``W[(x, y) <- (i, j)] = (q_xy . R_row[j - y]) * (q_xj . R_col[i - x])``
      (eq. (2)), each axis times its ``axial_scale`` factor; the norm between
      the two sub-layers is a per-channel affine map and is left out.
    """
    B, _, H, W = x.shape
    q, k, _ = (
        t.reshape(B, gsa.num_heads, -1, H, W) for t in
        # [B, Nh, d, H, W]
        gsa.qkv(x).split(
            [gsa.key_channels, gsa.key_channels, gsa.out_channels], 1))
    Nh = q.shape[1]
    rows, cols = queries[:, 0], queries[:, 1]
    q_p = q[..., rows, cols]  # [B, Nh, dkh, P]
    maps = {}
    if 'content' in gsa.components:
        k_soft = k.flatten(-2).softmax(-1)  # [B, Nh, dkh, HW]
        maps['content'] = torch.einsum('bnkp,bnkq->bnpq', q_p,
                                       k_soft).reshape(B, Nh, -1, H, W)
    col = row = None
    if 'column' in gsa.components:
        table = gsa.offset_range.crop(gsa.rel_col, 0, H)
        emb = relative_embeddings([table], [H])[0][rows]  # [P, H, dkh]
        # column weights of every pixel (x_p, j) of the query's row, over rows
        # i
        col = gsa.scale_axial(
            torch.einsum('bnkpj,pik->bnpij', q[:, :, :, rows, :], emb),
            'column', H)
    if 'row' in gsa.components:
        table = gsa.offset_range.crop(gsa.rel_row, 1, W)
        emb = relative_embeddings([table], [W])[0][cols]  # [P, W, dkh]
        # [B, Nh, P, W]
        row = gsa.scale_axial(
            torch.einsum('bnkp,pjk->bnpj', q_p, emb), 'row', W)
    if col is not None and row is not None:
        maps['positional'] = col * row[:, :, :, None, :]
    elif col is not None:  # column only: the query's own column
        mask = torch.zeros(len(cols), 1, W, dtype=col.dtype, device=col.device)
        mask[torch.arange(len(cols)), 0, cols] = 1
        maps['positional'] = col * mask
    elif row is not None:  # row only: the query's own row
        out = torch.zeros(
            B, Nh, len(rows), H, W, dtype=row.dtype, device=row.device)
        out[:, :, torch.arange(len(rows)), rows, :] = row
        maps['positional'] = out
    return maps
