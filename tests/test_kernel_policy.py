"""The device policy (``aa_det/models/layers/kernel_policy.py``) and the CUDA path run on the CPU.

``force_policy('cuda')`` gives CPU tensors the CUDA choices, so these tests execute what a GPU runs
under AMP: AA's folded fused SDPA on the autocast dtype (with the fp16 fold scale), GSA's bf16
products and one-chunk axial kernel, forward and backward, against the float64 loop references.
Errors are bounded as in tests/test_low_precision.py: by PyTorch's own SDPA error on the
same inputs and dtype.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.models.layers import gsa as gsa_mod
from aa_det.models.layers import relative_attention as ra
from aa_det.models.layers.kernel_policy import (CUDA_AXIAL_ELEMS, axial_chunk_elems, choose_impl, compute_dtype,
                                                force_policy, kernel_device)

from attention_inputs import aa_inputs, rel_err
from kernel_references import attention_reference, gsa_qkv, gsa_reference
from torch_versions import CPU_FP16_AUTOCAST, CPU_FP16_SDPA

LOW = [torch.bfloat16, pytest.param(torch.float16, marks=CPU_FP16_AUTOCAST)]


#: ops that CUDA runs as several kernels where another op needs one (docs/design.md): F.embedding's backward sorts
#: its indices above 3072 of them, F.pad fills its output and copies into it (and its backward copies)
CUDA_MULTI_KERNEL_OPS = ('embedding_dense_backward', 'constant_pad_nd')


class _Ops(TorchDispatchMode):
    """The aten ops that launch a kernel (as benchmarks/op_counts.py counts them: no views, allocations)."""

    def __init__(self):
        super().__init__()
        self.ops = []  # (name, output dims)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split('.')[0]
        if not func.is_view and isinstance(out, (torch.Tensor, tuple, list)) and \
                name not in ('detach', 'empty', 'empty_like', 'empty_strided'):
            self.ops.append((name, out.dim() if isinstance(out, torch.Tensor) else None))
        return out


def test_policy_follows_the_device_and_can_be_forced():
    assert kernel_device('cpu') == 'cpu' and kernel_device('cuda') == 'cuda' and kernel_device('mps') == 'cpu'
    with force_policy('cuda'):
        assert kernel_device('cpu') == 'cuda'
        with force_policy('cpu'):
            assert kernel_device('cuda') == 'cpu'
        assert kernel_device('cpu') == 'cuda'
        assert choose_impl(kernel_device('cpu'), 10, torch.bfloat16) == 'sdpa'
        assert axial_chunk_elems(kernel_device('cpu')) == CUDA_AXIAL_ELEMS
        assert compute_dtype(torch.float16, kernel_device('cpu')) == torch.bfloat16
    assert kernel_device('cpu') == 'cpu'
    with pytest.raises(ValueError, match='policy'):
        with force_policy('tpu'):
            pass



def _grads(out, gout, inputs):
    return [out, *torch.autograd.grad((out.double() * gout).sum(), inputs)]


@pytest.mark.parametrize('dtype', LOW)
def test_cuda_policy_runs_the_fused_aa_kernel_on_the_autocast_dtype(dtype, monkeypatch):
    """relative_attention under autocast with the CUDA policy: the folded fused SDPA runs on the
    autocast dtype (spied), and output and gradients (q, k, v, both tables) are within 1.1x of
    PyTorch's SDPA error on the same attention (relative logits as an additive mask) against the
    float64 loop reference."""
    H, W = 12, 10
    q, k, v, th, tw, gout = aa_inputs(0)
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v, th, tw)]
    ref = [t.detach() for t in _grads(attention_reference(*ref_inputs, H, W), gout, ref_inputs)]
    ran = []
    real = ra.attention_sdpa_folded
    monkeypatch.setattr(ra, 'attention_sdpa_folded', lambda *a: ran.append(a[7]) or real(*a))  # its dtype
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    ths, tws = (t.float().requires_grad_() for t in (th, tw))
    with force_policy('cuda'), torch.autocast('cpu', dtype=dtype):
        out = ra.relative_attention(qs, ks, vs, ths, tws, H, W)
    assert ran == [dtype] and out.dtype == dtype
    ours = _grads(out, gout, (qs, ks, vs, ths, tws))
    # PyTorch's SDPA on the same inputs and dtype, the relative logits (float32) as a mask
    qt, kt, vt = (t.to(dtype).requires_grad_() for t in (q, k, v))
    tht, twt = (t.float().requires_grad_() for t in (th, tw))
    rel_h, rel_w = ra.relative_logits(qt.float().view(2, 4, H, W, -1), tht, twt)
    bias = ra._add_relative(torch.zeros(2, 4, H * W, H * W), rel_h, rel_w, H, W)
    torchs = _grads(F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias.to(dtype), scale=1.0), gout,
                    (qt, kt, vt, tht, twt))
    for name, a, b, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'), ours, torchs, ref):
        assert rel_err(a, r) <= 1.1 * rel_err(b, r), (name, rel_err(a, r), rel_err(b, r))


@CPU_FP16_SDPA  # and float16 autocast on the CPU (torch 2.4)
def test_cuda_policy_fp16_fold_scale_keeps_large_relative_logits_finite():
    """Relative logits ~1e5-1e6 (past float16's 65504) under fp16 autocast and the CUDA policy:
    folded through the power-of-two scale, output and gradients finite and equal to the float32
    kernel on the same float16 q, k, v and the relative logits float16 holds, unfolded."""
    H, W = 12, 10
    q, k, v, th, tw, gout = aa_inputs(0)
    th, tw = th * 3e4, tw * 3e4
    qs, ks, vs = (t.half().requires_grad_() for t in (q, k, v))
    ths, tws = (t.float().requires_grad_() for t in (th, tw))
    with force_policy('cuda'), torch.autocast('cpu', dtype=torch.float16):
        out = ra.relative_attention(qs, ks, vs, ths, tws, H, W)
    grads = torch.autograd.grad((out.float() * gout.float()).sum(), (qs, ks, vs, ths, tws))
    assert all(torch.isfinite(t).all() for t in (out, *grads))
    folded, scale = ra.folded_queries(qs.detach(), ths.detach(), tws.detach(), H, W, 0, torch.float16)
    assert scale > 1
    rel = folded[..., 20:].float() * scale  # the relative logits float16 holds, unfolded: [B, Nh, HW, H + W]
    q16, k16, v16 = (t.detach().float() for t in (qs, ks, vs))
    expected = ra.attention_materialized(q16, k16, v16, rel[..., :H], rel[..., H:], H, W)
    torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=2e-3)


def _gsa_module(components=('content', 'column', 'row')):
    torch.manual_seed(0)
    gsa = GlobalSelfAttention2d(16, 16, num_heads=2, components=components, max_rel_dist=8).double()
    with torch.no_grad():
        for name in ('rel_col', 'rel_row'):
            getattr(gsa, name).mul_(4)  # positional terms as large as the content term
    return gsa


@pytest.mark.parametrize('dtype', LOW)
def test_cuda_policy_gsa_module_against_the_loop_reference(dtype, monkeypatch):
    """The GSA module with the CUDA policy under autocast: products in bf16 (fp16 inputs too), the
    axial kernels in one chunk per axis (spied), forward and backward (input and every parameter)
    against the float64 loop reference written from the paper's equations. The bound is the CPU
    policy's error on the same autocast run (its kernels are bounded one by one by PyTorch's SDPA
    error in tests/test_low_precision.py): the CUDA path is as exact, within 1.25x."""
    x = torch.randn(2, 16, 9, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    gsa = _gsa_module().train()
    xr = x.clone().requires_grad_()
    q, k, v = gsa_qkv(gsa, xr)
    ref = gsa_reference(q, k, v, gsa.rel_col, gsa.rel_row, norm=gsa.norm_col).reshape(2, 16, 9, 11)
    gout = torch.randn_like(ref)
    ref = [ref.detach(), *torch.autograd.grad((ref * gout).sum(), [xr] + list(gsa.parameters()))]
    chunks = []
    real = gsa_mod._axial_chunk
    monkeypatch.setattr(gsa_mod, '_axial_chunk', lambda q, v, e: chunks.append(v.shape[0]) or real(q, v, e))
    errors = {}
    for policy in ('cpu', 'cuda'):
        module, xs = _gsa_module().float().train(), x.float().requires_grad_()
        chunks.clear()
        with force_policy(policy), torch.autocast('cpu', dtype=dtype):
            out = module(xs)
        assert out.dtype == torch.bfloat16
        ours = [out, *torch.autograd.grad((out.double() * gout).sum(), [xs] + list(module.parameters()))]
        errors[policy] = [rel_err(a, r) for a, r in zip(ours, ref)]
    assert chunks == [2 * 2 * 11, 2 * 2 * 9]  # CUDA: one chunk per axis, all B * Nh * W (H) sequences
    names = ['out', 'x'] + [n for n, _ in gsa.named_parameters()]
    for name, cuda, cpu in zip(names, errors['cuda'], errors['cpu']):
        assert cuda <= 1.25 * cpu + 1e-6, (name, cuda, cpu)


@pytest.mark.parametrize('layer', ['aa', 'gsa'])
def test_cuda_policy_kernel_launches_do_not_grow_with_batch_or_size(layer):
    """One layer's forward + backward under bf16 autocast and the CUDA policy dispatches the same
    number of ops at 2x8x8 as at 4x24x18 (no loop over chunks or query blocks; both sizes pad
    the folded head dims), each counted after a first pass at its size; none of them is one that CUDA runs as
    several kernels where one would do (:data:`CUDA_MULTI_KERNEL_OPS`, a concatenation of more than 4 dims)."""
    counts = []
    for B, H, W in ((2, 8, 8), (4, 24, 18)):
        torch.manual_seed(0)  # a fresh layer each time: no gradient to accumulate into
        if layer == 'aa':
            module = AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4)
        else:
            module = GlobalSelfAttention2d(16, 16, num_heads=4)
        x = torch.randn(B, 16, H, W, requires_grad=True)
        with force_policy('cuda'), torch.autocast('cpu', dtype=torch.bfloat16):
            module(x)  # a size's first learning pass builds the constants cached per size
        ops = _Ops()
        with force_policy('cuda'), ops:
            with torch.autocast('cpu', dtype=torch.bfloat16):
                out = module(x)
            out.float().sum().backward()
        counts.append(len(ops.ops))
        multi = [(name, dims) for name, dims in ops.ops if name in CUDA_MULTI_KERNEL_OPS or name == 'cat' and dims > 4]
        assert not multi, multi
    assert counts[0] == counts[1], counts


def test_cuda_policy_gsa_copies_q_in_two_orders_and_v_once():
    """Under the CUDA policy a GSA layer's forward copies its qkv output into the layouts its GEMMs read: ``q`` in
    column and in row order, and ``v`` once, which content and column attention both read in place (the column
    GEMMs with its columns strided); row attention's ``v`` is a copy of the BatchNorm's output between the axes."""
    torch.manual_seed(0)
    module = GlobalSelfAttention2d(16, 16, num_heads=4)
    ops = _Ops()
    with force_policy('cuda'), ops, torch.autocast('cpu', dtype=torch.bfloat16):
        module(torch.randn(2, 16, 9, 11))
    copies = [name for name, dims in ops.ops if name in ('_to_copy', 'clone', 'copy_') and dims == 5]
    assert copies == ['_to_copy'] * 3 + ['clone'], copies


def test_aa_layer_casts_its_conv_parameters_in_one_op_each_way_under_autocast(monkeypatch):
    """Under bf16 autocast an AA layer casts the weights and biases of ``qkv``, ``proj`` and its convolutional part
    in one op, and their gradients back in one (``cast_together``): 10 casts become 2 casts and 2 concatenations,
    with the same outputs and gradients, bit for bit."""
    torch.manual_seed(0)
    conv = AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4)
    x = torch.randn(2, 16, 8, 8).bfloat16()

    def run():
        ops = _Ops()
        with force_policy('cuda'), ops:
            with torch.autocast('cpu', dtype=torch.bfloat16):
                out = conv(x)
            grads = torch.autograd.grad(out.float().sum(), list(conv.parameters()))
        return out, grads, len(ops.ops)

    together = run()
    monkeypatch.setattr(AAConv2d, 'conv_params', lambda self, device_type: {  # autocast casts each tensor itself
        name: (getattr(self, name).weight, getattr(self, name).bias) for name in ('qkv', 'proj', 'conv')})
    per_tensor = run()
    assert together[2] == per_tensor[2] - 6, (together[2], per_tensor[2])
    assert torch.equal(together[0], per_tensor[0])
    for a, b in zip(together[1], per_tensor[1]):
        assert torch.equal(a, b)


def test_cpu_policy_is_unchanged_by_the_switch():
    """Production on the CPU: the blocked kernel in float32 and cache-sized axial chunks."""
    assert choose_impl(kernel_device('cpu'), 10 ** 12, torch.bfloat16) == 'blocked'
    assert axial_chunk_elems('cpu') < CUDA_AXIAL_ELEMS


def test_axial_embeddings_are_both_axes_relative_embeddings():
    """GSA's embeddings of both axes in one gather equal each axis's own
    relative_embeddings, values and gradients, in float64, tables covering the map and clipped."""
    from aa_det.models.layers.gsa import axial_embeddings
    from aa_det.models.layers.relative_position import relative_embeddings
    g = torch.Generator().manual_seed(0)
    for mc, mr in ((12, 12), (5, 9), (3, 4)):
        tables = [torch.randn(2 * m - 1, 4, dtype=torch.float64, generator=g) for m in (mc, mr)]
        grads = [torch.randn(n, n, 4, dtype=torch.float64, generator=g) for n in (9, 7)]
        results = []
        for embed in (lambda c, r: axial_embeddings(c, r, 9, 7, torch.float64),
                      lambda c, r: (relative_embeddings(c, 9), relative_embeddings(r, 7))):
            ts = [t.clone().requires_grad_() for t in tables]
            embs = embed(*ts)
            results.append([*embs, *torch.autograd.grad(sum((e * gr).sum() for e, gr in zip(embs, grads)), ts)])
        for a, b in zip(*results):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize('chunk_elems', [None, 2 * 5 * 5])
def test_column_kernel_with_content_product_is_both_branches(chunk_elems):
    """Column attention whose kernel also computes content attention's product with the same q (q's
    gradients summed in its backward) gives both branches' outputs and the gradients of q, k, v and the table
    that the two separate branches give under autograd, in float64, in one chunk and in several."""
    from aa_det.models.layers.gsa import column_attention, content_attention, content_context
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, 4, 5, 3, dtype=torch.float64, generator=g) for _ in range(2))
    v = torch.randn(2, 2, 3, 5, 3, dtype=torch.float64, generator=g)
    table = torch.randn(7, 4, dtype=torch.float64, generator=g)
    grads = [torch.randn(2, 2, 3, 5, 3, dtype=torch.float64, generator=g) for _ in range(2)]
    results = []
    for fused in (True, False):
        ts = [t.clone().requires_grad_() for t in (q, k, v, table)]
        if fused:
            outs = column_attention(ts[0], ts[2], ts[3], chunk_elems,
                                    context=content_context(ts[1], ts[2], torch.float64))
        else:
            outs = column_attention(ts[0], ts[2], ts[3], chunk_elems), content_attention(*ts[:3])
        results.append([*outs, *torch.autograd.grad(sum((o * gr).sum() for o, gr in zip(outs, grads)), ts)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


@CPU_FP16_AUTOCAST
def test_cuda_policy_gsa_casts_once_in_and_once_out_under_fp16_autocast():
    """Under fp16 autocast GSA computes in bf16 (``compute_dtype``): its activations change dtype once
    forward (the input to bf16, for the qkv conv) and once backward (its gradient back to fp16), whatever
    the number of operand copies, products and softmaxes in between (parameters' casts aside)."""
    module = GlobalSelfAttention2d(16, 16, num_heads=4).train()
    x = torch.randn(2, 16, 9, 11).half().requires_grad_()

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.casts = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.split('.')[0] == '_to_copy' and args[0].dim() >= 4 and args[0].shape[0] == 2 \
                    and out.dtype != args[0].dtype:  # activations and their gradients (batch 2), no parameters
                self.casts.append((args[0].dtype, out.dtype))
            return out

    with force_policy('cuda'), torch.autocast('cpu', dtype=torch.float16):
        module(x)  # a size's first pass builds the cached constants
    forward, backward = Casts(), Casts()
    with force_policy('cuda'):
        with forward, torch.autocast('cpu', dtype=torch.float16):
            out = module(x)
        loss = out.float().sum()
        with backward:
            loss.backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert forward.casts == [(torch.float16, torch.bfloat16)], forward.casts
    # the loss's float32 gradient into the output's bf16, and the input's gradient back to fp16
    assert backward.casts == [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16)], backward.casts
