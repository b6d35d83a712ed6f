"""The kernels under fp16 / bf16 (AMP): error bounded by PyTorch's own SDPA error on the same inputs
and dtype, outputs and gradients finite on large-magnitude inputs, kernels chosen per device and dtype.

The CPU tests drive the same functions the CUDA path runs (``attention_sdpa_folded`` on low-precision
inputs, GSA's kernels on fp16 inputs); the ``cuda`` tests repeat them through autocast on a GPU.
Errors are relative Frobenius norms against float64 (single elements are rounding noise).
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.models.layers.gsa import column_attention, content_attention, row_attention
from aa_det.models.layers.kernel_policy import compute_dtype
from aa_det.models.layers.relative_attention import (_add_relative, attention_materialized, attention_sdpa_folded,
                                                     choose_impl, kernel_dtype,
                                                     relative_attention, relative_logits)

from attention_inputs import aa_inputs, rel_err
from torch_versions import CPU_FP16_AUTOCAST, CPU_FP16_MATMUL, CPU_FP16_SDPA

LOW = [torch.float16, torch.bfloat16]
#: LOW as parameters of CPU tests that multiply in float16
LOW_CPU = [pytest.param(torch.float16, marks=CPU_FP16_MATMUL), torch.bfloat16]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')


def _aa_run(kind, inputs, dtype, H=12, W=10, device='cpu'):
    """Output and gradients of eq. (3) computed by ``kind`` on inputs rounded to ``dtype``:
    'ours' (the folded fused kernel) or 'torch' (PyTorch's SDPA with the relative logits as an
    additive mask in ``dtype``, the plain way to run the same attention)."""
    q, k, v, th, tw, gout = (t.to(device) for t in inputs)
    acc = torch.float64 if dtype == torch.float64 else torch.float32  # relative logits, as under AMP
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    ths, tws = (t.to(acc).requires_grad_() for t in (th, tw))
    B, Nh, N, d = q.shape
    if kind == 'ours':
        out = attention_sdpa_folded(qs, ks, vs, ths, tws, H, W, dtype)
    else:
        rel_h, rel_w = relative_logits(qs.to(acc).view(B, Nh, H, W, d), ths, tws)
        bias = _add_relative(torch.zeros(B, Nh, N, N, dtype=acc, device=device), rel_h, rel_w, H, W)
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias.to(dtype), scale=1.0)
    grads = torch.autograd.grad((out.double() * gout).sum(), (qs, ks, vs, ths, tws))
    return [t.cpu() for t in (out, *grads)]


@pytest.mark.parametrize('dtype', LOW_CPU)
@pytest.mark.parametrize('seed', [0, 1])
def test_fused_aa_kernel_error_is_pytorchs_sdpa_error(dtype, seed):
    """Output and every gradient (q, k, v, both tables) of the folded kernel on fp16/bf16 inputs:
    error against float64 within 1.1x of PyTorch's SDPA running the same attention in that dtype
    (measured: 0.99-1.09x, the tables' gradients highest; the fp16 fold guard costs nothing, s = 1 here)."""
    inputs = aa_inputs(seed)
    ref = _aa_run('ours', inputs, torch.float64)
    ours, torchs = _aa_run('ours', inputs, dtype), _aa_run('torch', inputs, dtype)
    for name, a, b, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'), ours, torchs, ref):
        assert rel_err(a, r) <= 1.1 * rel_err(b, r), (name, rel_err(a, r), rel_err(b, r))


@CPU_FP16_SDPA
@pytest.mark.parametrize('q_scale, table_scale, grad_scale', [(1, 3e4, 1), (1e-4, 1e6, 1e-3)])
def test_fp16_fold_stays_finite_and_exact_beyond_fp16_range(q_scale, table_scale, grad_scale):
    """Relative logits up to ~1e6 (float16 ends at 65504), or table entries past 65504 beside small queries
    (with a small output gradient: q's is the tables' size), fold through a power-of-two scale: output and
    gradients finite, and the output is the float32 kernel's on the relative logits float16 holds, unfolded
    (the scale itself adds no error)."""
    from aa_det.models.layers.relative_attention import folded_queries
    q, k, v, th, tw, gout = aa_inputs(0)
    q, th, tw, gout = q * q_scale, th * table_scale, tw * table_scale, gout * grad_scale  # |q . r| ~ 1e5-1e6
    out, *grads = _aa_run('ours', (q, k, v, th, tw, gout), torch.float16)
    assert all(torch.isfinite(t).all() for t in (out, *grads))
    folded, scale = folded_queries(q.half(), th.float(), tw.float(), 12, 10, 0, torch.float16)
    assert scale > 1
    rel = folded[..., 20:].float() * scale  # [B, Nh, HW, H + W]
    q16, k16, v16 = (t.half().float() for t in (q, k, v))
    exact = torch.cat(relative_logits(q16.view(2, 4, 12, 10, 20), th.float(), tw.float()), -1)
    torch.testing.assert_close(rel, exact, rtol=0, atol=2e-3 * exact.abs().max().item())  # float16's rounding
    expected = attention_materialized(q16, k16, v16, rel[..., :12], rel[..., 12:], 12, 10)
    torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=2e-3)


def _gsa_inputs(seed, B=2, Nh=4, dk=8, dv=8, H=24, W=20):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return rnd(B, Nh, dk, H, W), rnd(B, Nh, dk, H, W), rnd(B, Nh, dv, H, W), rnd(63, dk) * dk ** -0.5, \
        rnd(B, Nh, dv, H, W)


GSA_KERNELS = {'content': lambda q, k, v, t: content_attention(q, k, v),
               'column': lambda q, k, v, t: column_attention(q, v, t),
               'row': lambda q, k, v, t: row_attention(q, v, t)}


def _gsa_run(kernel, inputs, dtype, device='cpu'):
    q, k, v, table, gout = (t.to(device) for t in inputs)
    ts = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    tab = table.to(torch.promote_types(dtype, torch.float32)).requires_grad_()
    out = GSA_KERNELS[kernel](*ts, tab)
    grads = torch.autograd.grad((out.double() * gout).sum(), ts + [tab], allow_unused=True)
    return [t.cpu() for t in (out, *grads) if t is not None]


@pytest.mark.parametrize('dtype', LOW)
@pytest.mark.parametrize('kernel', list(GSA_KERNELS))
def test_gsa_kernel_error_is_pytorchs_sdpa_error_in_its_compute_dtype(kernel, dtype):
    """GSA's kernels on fp16/bf16 inputs compute in ``compute_dtype`` (bf16 for fp16 inputs: their
    sums are unnormalised, so range matters more than fp16's three extra bits). Output and gradient
    errors against float64 within 1.5x of PyTorch's SDPA on plain attention over the same q, k, v in
    that dtype (measured: 0.9x for the axial kernels, 1.3x for content attention, whose context is
    rounded before the second product)."""
    inputs = _gsa_inputs(0)
    ref = _gsa_run(kernel, inputs, torch.float64)
    ours = _gsa_run(kernel, inputs, dtype)
    assert ours[0].dtype == compute_dtype(dtype, 'cpu')
    q, k, v = (t.flatten(-2).transpose(-1, -2) for t in inputs[:3])
    sdpa = F.scaled_dot_product_attention(*(t.to(compute_dtype(dtype, 'cpu')) for t in (q, k, v)))
    bound = 1.5 * rel_err(sdpa, F.scaled_dot_product_attention(q, k, v))
    for a, r in zip(ours, ref):
        assert rel_err(a, r) <= bound, (rel_err(a, r), bound)


@pytest.mark.parametrize('device', [pytest.param('cpu', marks=CPU_FP16_AUTOCAST), pytest.param('cuda', marks=cuda)])
def test_gsa_under_fp16_autocast_stays_finite_on_large_inputs(device):
    """Inputs x300: GSA's sums reach ~1e6, past float16; under fp16 autocast the module's
    output and every parameter gradient stay finite (before: inf in the forward)."""
    torch.manual_seed(0)
    gsa = GlobalSelfAttention2d(32, 32, num_heads=4).to(device)
    x = torch.randn(2, 32, 24, 20, device=device) * 300
    with torch.autocast(device, dtype=torch.float16):
        out = gsa(x)
    assert torch.isfinite(out).all() and out.abs().max() > 65504
    out.float().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in gsa.parameters() if p.grad is not None)


def test_kernels_are_chosen_per_device_and_dtype():
    """CPU: blocked, float32, whatever autocast says. CUDA: fused SDPA on the autocast dtype under
    AMP; in float32, materialised for small maps and fused above 64 MiB of logits."""
    for amp in (None, torch.bfloat16, torch.float16):
        assert choose_impl('cpu', 10, amp) == choose_impl('cpu', 10 ** 12, amp) == 'blocked'
        assert kernel_dtype('cpu', 'blocked', torch.bfloat16, amp) == torch.float32
    assert kernel_dtype('cpu', 'blocked', torch.float64) == torch.float64
    for amp in LOW:
        assert choose_impl('cuda', 2 * 8 * 400 ** 2, amp) == choose_impl('cuda', 8 * 8 * 1600 ** 2, amp) == 'sdpa'
        assert kernel_dtype('cuda', 'sdpa', amp, amp) == amp
        assert kernel_dtype('cuda', 'materialized', amp, amp) == torch.float32  # an explicit impl= stays fp32
    assert choose_impl('cuda', 2 * 8 * 400 ** 2) == 'materialized'
    assert compute_dtype(torch.float16, 'cpu') == torch.bfloat16
    assert compute_dtype(torch.bfloat16, 'cpu') == torch.bfloat16 and compute_dtype(torch.float32, 'cpu') == torch.float32


@cuda
@pytest.mark.parametrize('backend', [None, 'EFFICIENT_ATTENTION', 'CUDNN_ATTENTION', 'MATH'])
@pytest.mark.parametrize('dtype', LOW)
def test_cuda_autocast_aa_attention_error_is_pytorchs_sdpa_error(dtype, backend):
    """Through relative_attention under CUDA autocast (the fused kernel on the autocast dtype),
    output and gradients within 1.1x of PyTorch's SDPA with the same inputs, mask and dtype: each on the
    SDPA kernel PyTorch picks for it (``backend`` None; ours has no mask and a value head dim of its own,
    the reference a mask), or both on ``backend``'s kernel, like for like."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3; CUDA runs have 2.11
    inputs = aa_inputs(0)
    ref = _aa_run('ours', inputs, torch.float64)
    q, k, v, th, tw, gout = (t.cuda() for t in inputs)
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    ths, tws = (t.float().requires_grad_() for t in (th, tw))
    with sdpa_kernel(getattr(SDPBackend, backend)) if backend else contextlib.nullcontext():
        try:
            with torch.autocast('cuda', dtype=dtype):
                out = relative_attention(qs, ks, vs, ths, tws, 12, 10)
            ours = [t.cpu() for t in (out, *torch.autograd.grad((out.double() * gout).sum(),
                                                                (qs, ks, vs, ths, tws)))]
            torchs = _aa_run('torch', inputs, dtype, device='cuda')
        except RuntimeError as e:
            if backend and ('No available kernel' in str(e) or 'No viable backend' in str(e)):
                pytest.skip(f'{backend} runs not both: {str(e).splitlines()[0]}')
            raise
    for name, a, b, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'), ours, torchs, ref):
        assert rel_err(a, r) <= 1.1 * rel_err(b, r), (name, rel_err(a, r), rel_err(b, r))


@cuda
@pytest.mark.parametrize('dtype', LOW)
def test_cuda_autocast_memory_of_one_aa_conv_at_128x128_stays_linear(dtype):
    """The fused low-precision kernel never stores the logits: one 8-head AA conv at 128x128,
    forward + backward under autocast, below 1 GiB (its logits alone: 4 GiB in fp16)."""
    conv = AAConv2d(256, 256, 3, key_ratio=0.625, value_ratio=0.625, num_heads=8).cuda()
    x = torch.randn(1, 256, 128, 128, device='cuda', requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autocast('cuda', dtype=dtype):
        out = conv(x)
    out.float().square().mean().backward()
    torch.cuda.synchronize()
    assert (torch.cuda.max_memory_allocated() - base) / 2 ** 30 < 1.0
