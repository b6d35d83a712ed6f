"""The AA attention kernels against a loop reference written from eq. (3)."""
import pytest
import torch
from attention_inputs import saved_numel
from kernel_references import attention_reference, flex_attention_dense
from torch_versions import CPU_FP16_AUTOCAST, requires_torch

from aa_det.models.layers import AAConv2d, aa_channels, aa_conv
from aa_det.models.layers.aa_conv import relative_attention

FLEX = requires_torch(
    (2, 6), "FlexAttention with gradients of its score_mod's tensors")


def _inputs(B=2, Nh=3, H=5, W=7, d=4, dv=6, max_dist=4, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(
            *shape, generator=g, dtype=torch.float64).requires_grad_()

    return (rnd(B, Nh, H * W, d), rnd(B, Nh, H * W, d), rnd(B, Nh, H * W, dv),
            rnd(2 * max_dist - 1, d), rnd(2 * max_dist - 1, d))


@pytest.mark.parametrize('H,W,max_dist', [(5, 7, 4), (3, 1, 2), (1, 1, 3),
                                          (6, 5, 9)])
@pytest.mark.parametrize('impl', ['materialized', 'blocked', 'sdpa'])
def test_kernels_match_loop_reference(impl, H, W, max_dist):
    q, k, v, th, tw = _inputs(H=H, W=W, max_dist=max_dist)
    # 2 query rows/block
    extra = dict(block_logits=2 * 3 * H * W * 2) if impl == 'blocked' else {}
    results = []
    for out in (attention_reference(q, k, v, th, tw, H, W),
                relative_attention(q, k, v, th, tw, H, W, impl=impl, **extra)):
        grads = torch.autograd.grad((out * torch.cos(out)).sum(),
                                    (q, k, v, th, tw))
        results.append((out, grads))
    (ref, ref_g), (out, g) = results
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@FLEX
@pytest.mark.parametrize('position', [True, False])
@pytest.mark.parametrize('H,W,max_dist', [(5, 7, 4), (3, 1, 2), (1, 1, 3),
                                          (6, 5, 9)])
def test_flex_kernel_forward_matches_loop_reference(H, W, max_dist, position):
    """'flex' (CUDA's kernel) runs FlexAttention with the relative logits as
    its score_mod; on the CPU torch's own dense FlexAttention, forward only:
    against the float64 loop, offsets clipped (``max_dist < H, W``) or not,
    with and without the relative term, head dims below the kernel's 16
    (zero-padded)."""
    q, k, v, th, tw = (
        t.detach() for t in _inputs(H=H, W=W, max_dist=max_dist))
    th, tw = (th, tw) if position else (None, None)
    out = relative_attention(q, k, v, th, tw, H, W, impl='flex', scale=0.7)
    torch.testing.assert_close(
        out,
        attention_reference(q * 0.7, k, v, th, tw, H, W),
        rtol=1e-10,
        atol=1e-10)


@FLEX
@pytest.mark.parametrize('H,W,max_dist', [(5, 7, 4), (6, 5, 9)])
def test_flex_kernel_gradients_through_its_dense_math_match_loop_reference(
        H, W, max_dist, monkeypatch):
    """The gradients of 'flex' (q, k, v and both tables, through the relative
    logits by offset and the score_mod) with FlexAttention replaced by its
    dense math (CPU FlexAttention has no backward; the CUDA tests compare the
    fused kernel's own gradients)."""
    monkeypatch.setattr(aa_conv, 'attention_flex', flex_attention_dense)
    q, k, v, th, tw = _inputs(H=H, W=W, max_dist=max_dist)
    results = []
    for out in (attention_reference(q * 0.7, k, v, th, tw, H, W),
                relative_attention(
                    q, k, v, th, tw, H, W, impl='flex', scale=0.7)):
        grads = torch.autograd.grad((out * torch.cos(out)).sum(),
                                    (q, k, v, th, tw))
        results.append((out, grads))
    (ref, ref_g), (out, g) = results
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('queries, blocks', [(10, 9 * 2), (22, 5)])
def test_blocked_path_never_materialises_full_logits(monkeypatch, queries,
                                                     blocks):
    """With a small block bound, no logits block exceeds it, in the forward or
    the backward (which recomputes each block): a 9x11 map in runs of 10 and 1
    queries per row, or in blocks of 2 whole rows."""
    seen = []
    real = aa_conv.attention_materialized

    def spy(q, k, *args):
        seen.append(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])
        return real(q, k, *args)

    monkeypatch.setattr(aa_conv, 'attention_materialized', spy)
    q, k, v, th, tw = _inputs(H=9, W=11)
    bound = 2 * 3 * 99 * queries
    out = relative_attention(
        q, k, v, th, tw, 9, 11, impl='blocked', block_logits=bound)
    forward_calls = len(seen)
    out.sum().backward()
    assert forward_calls == blocks and len(seen) == 2 * blocks
    assert max(seen) <= bound < 2 * 3 * 99 * 99


def test_blocked_path_keeps_no_relative_logits():
    """An AA layer on the CPU keeps fewer elements for its backward than the
    relative logits alone would be (``B * Nh * HW * (H + W)``): each block
    computes its own."""
    torch.manual_seed(0)
    conv = AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4).train()
    x = torch.randn(2, 16, 40, 40, requires_grad=True)
    numel, _ = saved_numel(conv, x)
    assert numel < 2 * 4 * 40 * 40 * (40 + 40), numel


def test_blocked_path_without_position_encoding_matches_reference():
    q, k, v, _, _ = _inputs(H=4, W=6)
    outs = [
        attention_reference(q, k, v, None, None, 4, 6),
        relative_attention(
            q,
            k,
            v,
            None,
            None,
            4,
            6,
            impl='blocked',
            block_logits=2 * 3 * 24 * 5)
    ]
    grads = [torch.autograd.grad(o.sin().sum(), (q, k, v)) for o in outs]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-10)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def _conv(position, **kw):
    torch.manual_seed(0)
    return AAConv2d(
        8,
        16,
        3,
        key_channels=8,
        value_channels=8,
        num_heads=2,
        position=position,
        **kw).double().eval()


def test_translation_equivariance():
    """Moving the content inside a larger grid moves the output with it.

    The larger grid's extra keys are masked out exactly (an extra query dim of
    1 meets a key dim of -1e6, so their weights underflow to 0 in float64);
    what remains differs between placements only by a translation.
    """
    B, Nh, H, W = 2, 3, 4, 5
    q, k, v, th, tw = _inputs(B, Nh, H, W, max_dist=12)
    pad = torch.zeros(2 * 12 - 1, 1, dtype=torch.float64)
    tables = torch.cat([th, pad], 1), torch.cat([tw, pad], 1)

    def placed(top, left, H2=8, W2=9):

        def embed(t, fill):
            out = torch.full((B, Nh, H2, W2, t.shape[-1]), fill, dtype=t.dtype)
            out[:, :, top:top + H, left:left + W] = t.view(B, Nh, H, W, -1)
            return out.flatten(2, 3)

        ones = torch.ones(B, Nh, H * W, 1, dtype=torch.float64)
        keys = embed(torch.cat([k, 0 * ones], -1), 0.0)
        # masked keys: -1e6 in the extra dim only
        keys[..., -1] += embed(0 * ones, -1e6)[..., 0]
        out = relative_attention(
            embed(torch.cat([q, ones], -1), 1.0), keys, embed(v, 0.0), *tables,
            H2, W2)
        return out.view(B, Nh, H2, W2, -1)[:, :, top:top + H, left:left + W]

    torch.testing.assert_close(placed(0, 0), placed(3, 4))
    small = relative_attention(q, k, v, th, tw, H, W).view(B, Nh, H, W, -1)
    torch.testing.assert_close(placed(3, 4), small)


@pytest.mark.parametrize('position,equivariant', [('none', True),
                                                  ('relative', False)])
def test_permutation_equivariance(position, equivariant):
    conv = _conv(position)
    x = torch.randn(2, 8, 5, 6, dtype=torch.float64)
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(1))
    q, k, v, hw = conv.qkv_heads(x)
    tables = (conv.rel_h, conv.rel_w) if position == 'relative' else (None,
                                                                      None)
    out = relative_attention(q, k, v, *tables, *hw, scale=conv.scale)
    xp = x.flatten(-2)[..., perm].reshape(x.shape)
    qp, kp, vp, _ = conv.qkv_heads(xp)
    outp = relative_attention(qp, kp, vp, *tables, *hw, scale=conv.scale)
    assert torch.allclose(out[:, :, perm], outp) == equivariant


@pytest.mark.parametrize(
    'dtype',
    [torch.bfloat16,
     pytest.param(torch.float16, marks=CPU_FP16_AUTOCAST)])
def test_autocast_keeps_logits_finite(dtype):
    conv = AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4)
    x = torch.randn(2, 16, 7, 9) * 300  # logits far beyond fp16's range
    with torch.autocast('cpu', dtype=dtype):
        out = conv(x)
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    assert all(
        torch.isfinite(p.grad).all() for p in conv.parameters()
        if p.grad is not None)


@pytest.mark.parametrize('stride,down,size,expect',
                         [(1, False, (9, 13), (9, 13)),
                          (2, False, (9, 13), (5, 7)),
                          (1, True, (9, 13), (9, 13)),
                          (2, True, (1, 1), (1, 1)),
                          (2, True, (10, 7), (5, 4))])
@pytest.mark.parametrize('position', ['relative', 'none', 'sine', 'coord'])
def test_aaconv_shapes(stride, down, size, expect, position):
    conv = AAConv2d(
        16,
        32,
        3,
        stride=stride,
        num_heads=4,
        min_key_dim_per_head=4,
        position=position,
        attn_downsample=down)
    out = conv(torch.randn(2, 16, *size))
    assert out.shape == (2, 32, *expect)
    conv2d = torch.nn.Conv2d(16, 32, 3, stride, 1)
    assert out.shape == conv2d(torch.randn(2, 16, *size)).shape


def test_fully_attentional():
    conv = AAConv2d(
        32,
        32,
        3,
        key_ratio=1.0,
        value_ratio=1.0,
        num_heads=8,
        min_key_dim_per_head=1)
    assert conv.conv is None and conv.value_channels == 32
    assert conv(torch.randn(1, 32, 5, 3)).shape == (1, 32, 5, 3)


@pytest.mark.parametrize('kwargs,message', [
    (dict(key_channels=30), 'key_channels'),
    (dict(value_channels=12, num_heads=8), 'value_channels'),
    (dict(value_channels=72), 'exceeds out_channels'),
    (dict(position='learned'), 'position'),
    (dict(stride=3), 'stride'),
    (dict(max_rel_dist=0), 'max_rel_dist'),
])
def test_bad_settings_fail_at_construction(kwargs, message):
    base = dict(num_heads=4)
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        AAConv2d(64, 64, 3, **base)


@pytest.mark.parametrize('fin,fout,kappa,upsilon', [(128, 160, 0.2, 0.1),
                                                    (256, 256, 0.5, 0.5),
                                                    (64, 128, 0.25, 0.25)])
def test_parameter_change_matches_eq4(fin, fout, kappa, upsilon):
    """Params(AAConv) - Params(conv) = Fin*Fout*(2k + (1-9)u + Fout/Fin u^2) +
    biases + tables."""
    conv = AAConv2d(
        fin,
        fout,
        3,
        key_ratio=kappa,
        value_ratio=upsilon,
        num_heads=8,
        min_key_dim_per_head=1,
        max_rel_dist=8)
    dk, dv = conv.key_channels, conv.value_channels
    assert (dk, dv) == (round(kappa * fout), round(upsilon * fout))
    n_aa = sum(p.numel() for p in conv.parameters())
    eq4 = fin * fout * (2 * kappa +
                        (1 - 9) * upsilon + fout / fin * upsilon**2)
    # qkv/proj biases, relative tables
    extra = (2 * dk + dv) + dv + 2 * (2 * 8 - 1) * dk // 8
    assert n_aa - 9 * fin * fout == pytest.approx(eq4 + extra, abs=1)


def test_channel_rule_reproduces_table9():
    """ResNet-50 stage widths with kappa=2*upsilon=0.2, Nh=8, >=20 dims per key
    head."""
    assert [aa_channels(w, 0.2, 0.1, 8, 20)
            for w in (128, 256, 512)] == [(160, 16), (160, 24), (160, 48)]


cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize('H,W', [(5, 7), (1, 1), (17, 12)])
def test_cuda_fused_path_matches_reference(H, W):
    """The folded fused-SDPA kernel (CUDA default for large maps) against the
    float64 reference."""
    # value head dims like AA-ResNet-50's
    q, k, v, th, tw = _inputs(H=H, W=W, max_dist=6, dv=3)
    ref = relative_attention(q, k, v, th, tw, H, W, impl='materialized')
    ref_g = torch.autograd.grad(ref.square().sum(), (q, k, v, th, tw))
    dev = [
        t.detach().float().cuda().requires_grad_() for t in (q, k, v, th, tw)
    ]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # fails rather than fall back to math
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out = relative_attention(*dev, H, W, impl='sdpa')
    g = torch.autograd.grad(out.square().sum(), dev)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-4)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a.double().cpu(), b, rtol=1e-3, atol=1e-3)


@cuda
def test_cuda_memory_of_one_aa_conv_at_128x128_stays_linear():
    """Forward+backward of one 8-head AA conv at 128x128 under 1 GiB (naive
    logits alone: 8 GiB)."""
    # dkh = dvh = 20
    conv = AAConv2d(
        256, 256, 3, key_ratio=0.625, value_ratio=0.625, num_heads=8).cuda()
    x = torch.randn(1, 256, 128, 128, device='cuda', requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    conv(x).square().mean().backward()
    torch.cuda.synchronize()
    print(
        f'peak {(torch.cuda.max_memory_allocated() - base) / 2 ** 30:.3f} GiB')
    assert (torch.cuda.max_memory_allocated() - base) / 2**30 < 1.0


@cuda
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_cuda_autocast_keeps_logits_finite(dtype):
    conv = AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4).cuda()
    with torch.autocast('cuda', dtype=dtype):
        out = conv(torch.randn(2, 16, 7, 9, device='cuda') * 300)
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    assert all(
        torch.isfinite(p.grad).all() for p in conv.parameters()
        if p.grad is not None)
