"""The GSA module against a loop reference written from the GSA paper's
equations."""
import pytest
import torch
from kernel_references import gsa_qkv, gsa_reference

from aa_det.models.layers import GlobalSelfAttention2d


# a batch norm reads the column layout as it is, GN the maps
@pytest.mark.parametrize('norm', ['BN', 'GN'])
@pytest.mark.parametrize('H,W,max_dist', [(5, 3, 8), (4, 7, 3), (1, 1, 2)])
def test_gsa_matches_loop_reference(H, W, max_dist, norm):
    torch.manual_seed(0)
    norm_cfg = dict(
        type='GN', num_groups=2) if norm == 'GN' else dict(type='BN')
    gsa = GlobalSelfAttention2d(
        8, 8, num_heads=2, max_rel_dist=max_dist, norm_cfg=norm_cfg).double()
    x = torch.randn(2, 8, H, W, dtype=torch.float64, requires_grad=True)
    out = gsa(x)
    q, k, v = gsa_qkv(gsa, x)
    ref = gsa_reference(
        q, k, v, gsa.rel_col, gsa.rel_row,
        norm=gsa.norm_col).reshape(out.shape)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    params = [x, gsa.rel_col, gsa.rel_row, gsa.qkv.weight]
    g = torch.autograd.grad((out * out.cos()).sum(), params)
    g_ref = torch.autograd.grad((ref * ref.cos()).sum(), params)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_content_attention_is_permutation_equivariant_positional_is_not():
    torch.manual_seed(0)
    x = torch.randn(1, 8, 4, 5, dtype=torch.float64)
    perm = torch.randperm(20)
    xp = x.flatten(-2)[..., perm].reshape(x.shape)
    for components, equivariant in ((('content', ), True),
                                    (('content', 'column', 'row'), False)):
        gsa = GlobalSelfAttention2d(
            8, 8, num_heads=2, components=components).double().eval()
        out, outp = gsa(x).flatten(-2), gsa(xp).flatten(-2)
        assert torch.allclose(out[..., perm], outp) == equivariant


@pytest.mark.parametrize('components', [('content', ), ('column', ), ('row', ),
                                        ('column', 'row'),
                                        ('content', 'column'),
                                        ('content', 'row')])
def test_ablation_variants(components):
    gsa = GlobalSelfAttention2d(16, 16, num_heads=4, components=components)
    out = gsa(torch.randn(2, 16, 6, 5))
    assert out.shape == (2, 16, 6, 5)
    out.sum().backward()
    assert all(p.grad is not None for p in gsa.parameters())
    assert hasattr(gsa, 'rel_col') == ('column' in components)
    assert hasattr(gsa, 'rel_row') == ('row' in components)


@pytest.mark.parametrize('size', [(9, 13), (1, 1), (2, 5)])
def test_stride_two_matches_strided_conv(size):
    out = GlobalSelfAttention2d(
        16, 16, stride=2).eval()(
            torch.randn(1, 16, *size))
    # the shortcut's size
    ref = torch.nn.Conv2d(16, 16, 1, 2)(torch.randn(1, 16, *size))
    assert out.shape == ref.shape


def test_any_size_with_one_set_of_weights():
    gsa = GlobalSelfAttention2d(16, 16, max_rel_dist=4)
    for size in [(3, 3), (17, 5), (40, 64)]:
        assert gsa(torch.randn(1, 16, *size)).shape[-2:] == size


@pytest.mark.parametrize('kwargs,message',
                         [(dict(num_heads=3), 'key_channels'),
                          (dict(components=('col', )), 'components'),
                          (dict(stride=4), 'stride')])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GlobalSelfAttention2d(16, 16, **kwargs)


@pytest.mark.parametrize('H,W,max_dist', [(7, 5, 3), (1, 6, 2), (9, 1, 12)])
def test_axial_attention_chunks_match_loop_reference(H, W, max_dist):
    """Column and row attention computed in chunks of one sequence: outputs and
    gradients exact."""
    from aa_det.models.layers.gsa import column_attention
    from aa_det.models.layers.relative_position import relative_embeddings

    def col_attention(q, v, table, chunk_logits):
        emb, = relative_embeddings([table], [q.shape[-2]])
        return column_attention(q, v, emb, chunk_logits)

    # as the layer computes it: columns of the transposed maps
    def row_attention(q, v, table, chunk_logits):
        return col_attention(
            q.transpose(-1, -2), v.transpose(-1, -2), table,
            chunk_logits).transpose(-1, -2)

    torch.manual_seed(0)
    q, v = (
        torch.randn(2, 3, d, H, W, dtype=torch.float64, requires_grad=True)
        for d in (4, 5))
    table = torch.randn(
        2 * max_dist - 1, 4, dtype=torch.float64, requires_grad=True)

    def clip(off):
        return max(-(max_dist - 1), min(max_dist - 1, off)) + max_dist - 1

    ref_col = torch.stack([
        torch.stack([
            sum((q[..., x, y] * table[clip(i - x)]).sum(-1, keepdim=True) *
                v[..., i, y] for i in range(H)) for y in range(W)
        ], -1) for x in range(H)
    ], -2)
    ref_row = torch.stack([
        torch.stack([
            sum((q[..., x, y] * table[clip(j - y)]).sum(-1, keepdim=True) *
                v[..., x, j] for j in range(W)) for y in range(W)
        ], -1) for x in range(H)
    ], -2)
    for fn, ref in ((col_attention, ref_col), (row_attention, ref_row)):
        length = H if fn is col_attention else W
        # one sequence per chunk
        out = fn(q, v, table, chunk_logits=length * (2 * length - 1))
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        g = torch.autograd.grad((out * out.cos()).sum(), (q, v, table))
        g_ref = torch.autograd.grad((ref * ref.cos()).sum(), (q, v, table))
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_gsa_under_bf16_autocast_is_finite():
    gsa = GlobalSelfAttention2d(16, 16, num_heads=4)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = gsa(torch.randn(2, 16, 9, 7) * 30)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and all(
        torch.isfinite(p.grad).all() for p in gsa.parameters())


@pytest.mark.parametrize('heads, size', [(1, (7, 2)), (2, (7, 1)),
                                         (2, (1, 7))])
def test_gsa_backward_with_batch_one_and_degenerate_views(heads, size):
    """B == 1 with one head or a 1-wide map: the axial kernel's inputs are
    views, not copies."""
    gsa = GlobalSelfAttention2d(8, 8, num_heads=heads)
    x = torch.randn(1, 8, *size, requires_grad=True)
    gsa(x).square().sum().backward()
    assert torch.isfinite(x.grad).all(
    ) and gsa.rel_col.grad is not None and gsa.rel_row.grad is not None


def test_gsa_is_evaluated_once_per_training_step(monkeypatch):
    """Without a block's ``with_cp`` the layer is computed once per training
    step: its backward recomputes nothing of the layer (``with_cp``,
    tests/test_backbones.py, is the one memory-for-time trade)."""
    calls = []
    attention = GlobalSelfAttention2d.attention
    monkeypatch.setattr(
        GlobalSelfAttention2d, 'attention',
        lambda self, x: calls.append(x.shape) or attention(self, x))
    gsa = GlobalSelfAttention2d(16, 16, num_heads=4).train()
    x = torch.randn(2, 16, 9, 7, requires_grad=True)
    out = gsa(x)
    assert len(calls) == 1
    out.square().sum().backward()
    assert len(
        calls) == 1 and x.grad is not None and gsa.rel_col.grad is not None


def test_gsa_keeps_the_papers_maps_not_the_logits_and_updates_statistics_once(
):
    """In training the layer keeps what its backward needs, maps of its width
    (``x``, ``q``, ``softmax(K)``, ``v``, the content product's operands, the
    column and BatchNorm outputs; 11.3x the input counting each op's own
    reference), never the axial logits (``B Nh W H^2`` per axis, here 20x the
    input, which the chunked kernel recomputes one chunk at a time);
    ``norm_col``'s running statistics move once per step, as in a forward that
    records no graph."""
    torch.manual_seed(0)
    gsa = GlobalSelfAttention2d(16, 16, num_heads=4).train()
    B, C, H, W = 2, 16, 80, 10
    x = torch.randn(B, C, H, W, requires_grad=True)
    params = {p.data_ptr() for p in gsa.parameters()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t) or t, lambda t: t):
        out = gsa(x)
    saved = [t.numel() for t in saved if t.data_ptr() not in params]
    assert B * gsa.num_heads * W * H * H == 20 * x.numel()  # one axis' logits
    assert max(saved) <= x.numel() and sum(saved) <= 12 * x.numel(), (
        max(saved), sum(saved) / x.numel())
    out.square().sum().backward()
    with torch.no_grad():
        reference = GlobalSelfAttention2d(16, 16, num_heads=4).train()
        reference.load_state_dict(
            {k: v
             for k, v in gsa.state_dict().items() if 'norm_col' not in k},
            strict=False)
        reference(x)
    assert int(gsa.norm_col.num_batches_tracked) == 1
    torch.testing.assert_close(gsa.norm_col.running_mean,
                               reference.norm_col.running_mean)
    torch.testing.assert_close(gsa.norm_col.running_var,
                               reference.norm_col.running_var)
