"""The kernels under fp16 / bf16 (AMP): error bounded by PyTorch's own SDPA
error on the same inputs and dtype, outputs and gradients finite on
large-magnitude inputs, kernels chosen per device and dtype.

The CPU tests drive the same functions the CUDA path runs
(``relative_attention(impl='sdpa')`` on low-precision inputs, GSA's kernels in
their compute dtype); the ``cuda`` tests repeat them through autocast on a GPU.
Errors are relative Frobenius norms against float64 (single elements are
rounding noise).
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from attention_inputs import aa_inputs, rel_err
from torch_versions import CPU_FP16_AUTOCAST, CPU_FP16_MATMUL, CPU_FP16_SDPA

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.models.layers.aa_conv import (attention_materialized,
                                          relative_attention, relative_logits)
from aa_det.models.layers.gsa import (column_attention, compute_dtype,
                                      content_attention)
from aa_det.models.layers.relative_position import relative_embeddings

LOW = [torch.float16, torch.bfloat16]
#: LOW as parameters of CPU tests that multiply in float16
LOW_CPU = [pytest.param(torch.float16, marks=CPU_FP16_MATMUL), torch.bfloat16]
cuda = pytest.mark.cuda


def _aa_run(kind, inputs, dtype, H=12, W=10, device='cpu'):
    """Output and gradients of eq. (3) computed by ``kind`` on inputs rounded
    to ``dtype``: 'ours' (the folded fused kernel) or 'torch' (PyTorch's SDPA
    with the relative logits as an additive mask in ``dtype``, the plain way to
    run the same attention)."""
    q, k, v, th, tw, gout = (t.to(device) for t in inputs)
    # relative logits, as under AMP
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    ths, tws = (t.to(acc).requires_grad_() for t in (th, tw))
    if kind == 'ours':
        out = relative_attention(qs, ks, vs, ths, tws, H, W, impl='sdpa')
    else:
        rel_h, rel_w = relative_logits(
            qs.to(acc).unflatten(2, (H, W)),
            *relative_embeddings([ths, tws], [H, W]))
        # [B, Nh, HW, HW]
        bias = (rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)).flatten(-2)
        out = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=bias.to(dtype), scale=1.0)
    grads = torch.autograd.grad((out.double() * gout).sum(),
                                (qs, ks, vs, ths, tws))
    return [t.cpu() for t in (out, *grads)]


@pytest.mark.parametrize('dtype', LOW_CPU)
@pytest.mark.parametrize('seed', [0, 1])
def test_fused_aa_kernel_error_is_pytorchs_sdpa_error(dtype, seed):
    """Output and every gradient (q, k, v, both tables) of the folded kernel on
    fp16/bf16 inputs: error against float64 within 1.1x of PyTorch's SDPA
    running the same attention in that dtype (measured: 0.99-1.09x, the tables'
    gradients highest; the fp16 fold guard costs nothing, s = 1 here)."""
    inputs = aa_inputs(seed)
    ref = _aa_run('ours', inputs, torch.float64)
    ours, torchs = _aa_run('ours', inputs,
                           dtype), _aa_run('torch', inputs, dtype)
    for name, a, b, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'),
                             ours, torchs, ref):
        assert rel_err(a, r) <= 1.1 * rel_err(b, r), (name, rel_err(a, r),
                                                      rel_err(b, r))


@CPU_FP16_SDPA
@pytest.mark.parametrize('q_scale, table_scale, grad_scale',
                         [(1, 3e4, 1), (1e-4, 1e6, 1e-3)])
def test_fp16_fold_stays_finite_and_exact_beyond_fp16_range(
        q_scale, table_scale, grad_scale):
    """Relative logits up to ~1e6 (float16 ends at 65504), or table entries
    past 65504 beside small queries (with a small output gradient: q's is the
    tables' size), fold through a power-of-two scale: output and gradients
    finite, and the output is the float32 kernel's on the relative logits
    float16 holds, unfolded (the scale itself adds no error)."""
    q, k, v, th, tw, gout = aa_inputs(0)
    # |q . r| ~ 1e5-1e6
    q, th, tw, gout = (q * q_scale, th * table_scale, tw * table_scale,
                       gout * grad_scale)
    out, *grads = _aa_run('ours', (q, k, v, th, tw, gout), torch.float16)
    assert all(torch.isfinite(t).all() for t in (out, *grads))
    q16, k16, v16 = (t.half().float() for t in (q, k, v))
    rel_h, rel_w = relative_logits(
        q16.unflatten(2, (12, 10)),
        *relative_embeddings([th.float(), tw.float()], [12, 10]))
    s = 2.0**torch.frexp(
        torch.maximum(rel_h.abs().amax(),
                      rel_w.abs().amax()) / 2**14).exponent.clamp(0, 15)
    # table entries past 65504 stay float32: only large logits need s
    assert (s > 1) == (q_scale == 1)
    # what float16 holds, unfolded
    rel_h, rel_w = ((t / s).half().float() * s for t in (rel_h, rel_w))
    expected = attention_materialized(q16, k16, v16, rel_h, rel_w, 12, 10)
    torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=2e-3)


def _gsa_inputs(seed, B=2, Nh=4, dk=8, dv=8, H=24, W=20):
    g = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64)

    return (rnd(B, Nh, dk, H, W), rnd(B, Nh, dk, H, W), rnd(B, Nh, dv, H, W),
            rnd(63, dk) * dk**-0.5, rnd(B, Nh, dv, H, W))


def _emb(table, q, axis):
    """The module's embeddings of ``table`` for ``q``'s ``axis`` (-2: column,
    -1: row), in ``q``'s dtype."""
    return relative_embeddings([table], [q.shape[axis]], q.dtype)[0]


GSA_KERNELS = {
    'content': lambda q, k, v, t: content_attention(q, k, v),
    'column': lambda q, k, v, t: column_attention(q, v, _emb(t, q, -2)),
    # as the layer: transposed maps
    'row': lambda q, k, v, t: column_attention(q.mT, v.mT, _emb(t, q, -1)).mT
}


def _gsa_run(kernel, inputs, dtype, device='cpu'):
    """A GSA kernel's output and gradients on inputs in ``dtype``, computed as
    the module does: in ``compute_dtype``."""
    q, k, v, table, gout = (t.to(device) for t in inputs)
    ts = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    dtype = compute_dtype(dtype, torch.device(device))
    tab = table.to(torch.promote_types(dtype, torch.float32)).requires_grad_()
    out = GSA_KERNELS[kernel](*(t.to(dtype) for t in ts), tab)
    grads = torch.autograd.grad(
        (out.double() * gout).sum(), ts + [tab], allow_unused=True)
    return [t.cpu() for t in (out, *grads) if t is not None]


@pytest.mark.parametrize('dtype', LOW)
@pytest.mark.parametrize('kernel', list(GSA_KERNELS))
def test_gsa_kernel_error_is_pytorchs_sdpa_error_in_its_compute_dtype(
        kernel, dtype):
    """GSA's kernels on fp16/bf16 inputs compute in ``compute_dtype`` (bf16 for
    fp16 inputs: their sums are unnormalised, so range matters more than fp16's
    three extra bits). Output and gradient errors against float64 within 1.5x
    of PyTorch's SDPA on plain attention over the same q, k, v in that dtype
    (measured: 0.9x for the axial kernels, 1.3x for content attention, whose
    context is rounded before the second product)."""
    inputs = _gsa_inputs(0)
    ref = _gsa_run(kernel, inputs, torch.float64)
    ours = _gsa_run(kernel, inputs, dtype)
    assert ours[0].dtype == compute_dtype(dtype, torch.device('cpu'))
    q, k, v = (t.flatten(-2).transpose(-1, -2) for t in inputs[:3])
    sdpa = F.scaled_dot_product_attention(
        *(t.to(compute_dtype(dtype, torch.device('cpu'))) for t in (q, k, v)))
    bound = 1.5 * rel_err(sdpa, F.scaled_dot_product_attention(q, k, v))
    for a, r in zip(ours, ref):
        assert rel_err(a, r) <= bound, (rel_err(a, r), bound)


@pytest.mark.parametrize('device', [
    pytest.param('cpu', marks=CPU_FP16_AUTOCAST),
    pytest.param('cuda', marks=cuda)
])
def test_gsa_under_fp16_autocast_stays_finite_on_large_inputs(device):
    """Inputs x300: GSA's sums reach ~1e6, past float16; under fp16 autocast
    the module's output and every parameter gradient stay finite (before: inf
    in the forward)."""
    torch.manual_seed(0)
    gsa = GlobalSelfAttention2d(32, 32, num_heads=4).to(device)
    x = torch.randn(2, 32, 24, 20, device=device) * 300
    with torch.autocast(device, dtype=torch.float16):
        out = gsa(x)
    assert torch.isfinite(out).all() and out.abs().max() > 65504
    out.float().mean().backward()
    assert all(
        torch.isfinite(p.grad).all() for p in gsa.parameters()
        if p.grad is not None)


def test_kernels_compute_in_float32_on_the_cpu_and_in_bf16_for_gsa_under_fp16(
):
    """AA on the CPU: the blocked kernel in float32 whatever autocast says,
    float64 as it is; the output in the inputs' dtype. GSA: float16 computes in
    bfloat16, other dtypes as they are."""
    q, k, v, th, tw, _ = aa_inputs(0)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = relative_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                 th.float(), tw.float(), 12, 10)
    ref = relative_attention(
        q.bfloat16().float(),
        k.bfloat16().float(),
        v.bfloat16().float(),
        th.float(),
        tw.float(),
        12,
        10,
        impl='materialized')
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref.bfloat16())
    assert relative_attention(q, k, v, th, tw, 12, 10).dtype == torch.float64
    cpu = torch.device('cpu')
    assert compute_dtype(torch.float16, cpu) == torch.bfloat16
    assert compute_dtype(torch.bfloat16,
                         cpu) == torch.bfloat16 and compute_dtype(
                             torch.float32, cpu) == torch.float32


@cuda
@pytest.mark.parametrize(
    'backend', [None, 'EFFICIENT_ATTENTION', 'CUDNN_ATTENTION', 'MATH'])
@pytest.mark.parametrize('dtype', LOW)
def test_cuda_autocast_aa_attention_error_is_pytorchs_sdpa_error(
        dtype, backend):
    """Through relative_attention under CUDA autocast (the fused kernel on the
    autocast dtype), output and gradients within 1.1x of PyTorch's SDPA with
    the same inputs, mask and dtype: each on the SDPA kernel PyTorch picks for
    it (``backend`` None; ours has no mask and a value head dim of its own, the
    reference a mask), or both on ``backend``'s kernel, like for like."""
    # torch >= 2.3; CUDA runs have 2.11
    from torch.nn.attention import SDPBackend, sdpa_kernel
    inputs = aa_inputs(0)
    ref = _aa_run('ours', inputs, torch.float64)
    q, k, v, th, tw, gout = (t.cuda() for t in inputs)
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    ths, tws = (t.float().requires_grad_() for t in (th, tw))
    with sdpa_kernel(getattr(
            SDPBackend, backend)) if backend else contextlib.nullcontext():
        try:
            with torch.autocast('cuda', dtype=dtype):
                out = relative_attention(qs, ks, vs, ths, tws, 12, 10)
            ours = [
                t.cpu() for t in (out, *torch.autograd.grad((
                    out.double() * gout).sum(), (qs, ks, vs, ths, tws)))
            ]
            torchs = _aa_run('torch', inputs, dtype, device='cuda')
        except RuntimeError as e:
            if backend and ('No available kernel' in str(e)
                            or 'No viable backend' in str(e)):
                pytest.skip(
                    f'{backend} runs not both: {str(e).splitlines()[0]}')
            raise
    for name, a, b, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'),
                             ours, torchs, ref):
        assert rel_err(a, r) <= 1.1 * rel_err(b, r), (name, rel_err(a, r),
                                                      rel_err(b, r))


@cuda
@pytest.mark.parametrize('dtype', LOW)
def test_cuda_autocast_memory_of_one_aa_conv_at_128x128_stays_linear(dtype):
    """The fused low-precision kernel never stores the logits: one 8-head AA
    conv at 128x128, forward + backward under autocast, below 1 GiB (its logits
    alone: 4 GiB in fp16)."""
    conv = AAConv2d(
        256, 256, 3, key_ratio=0.625, value_ratio=0.625, num_heads=8).cuda()
    x = torch.randn(1, 256, 128, 128, device='cuda', requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autocast('cuda', dtype=dtype):
        out = conv(x)
    out.float().square().mean().backward()
    torch.cuda.synchronize()
    assert (torch.cuda.max_memory_allocated() - base) / 2**30 < 1.0
