"""What a GPU runs, run on the CPU (the CUDA device policy forced,
:mod:`aa_det.models.layers.device_policy`): AA's kernels (FlexAttention, CUDA's
from torch 2.6; the fused ``'sdpa'`` on older releases, on the autocast dtype
with the float16 fold scale), GSA's bfloat16 products under autocast, forward
and backward, against the float64 loop references; the same number of launches
at every size. Errors are bounded as in tests/test_low_precision.py: by
PyTorch's own SDPA error on the same inputs and dtype. The tests marked
``cuda`` run the fused kernels, compiled, on a GPU (benchmarks/gpu_check.sh
runs them first).
"""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from attention_inputs import aa_inputs, rel_err
from kernel_references import (attention_reference, flex_attention_dense,
                               gsa_qkv, gsa_reference)
from torch.utils._python_dispatch import TorchDispatchMode
from torch_versions import CPU_FP16_AUTOCAST

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d, aa_conv
from aa_det.models.layers.device_policy import (HAS_FLEX_ATTENTION,
                                                forced_device_policy)
from aa_det.models.layers.relative_position import relative_embeddings

LOW = [torch.bfloat16, pytest.param(torch.float16, marks=CPU_FP16_AUTOCAST)]


class _Ops(TorchDispatchMode):
    """The aten ops that launch a kernel (as benchmarks/op_counts.py counts
    them: no views, allocations)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split('.')[0]
        if (not func.is_view and isinstance(out, (torch.Tensor, tuple, list))
                and name
                not in ('detach', 'empty', 'empty_like', 'empty_strided')):
            self.ops.append(name)
        return out


def _grads(out, gout, inputs):
    return [out, *torch.autograd.grad((out.double() * gout).sum(), inputs)]


@pytest.mark.parametrize(
    'device,kernel',
    [('cpu', 'attention_blocked'),
     ('cuda', 'attention_flex' if HAS_FLEX_ATTENTION else 'attention_sdpa')])
def test_auto_picks_the_devices_kernel(monkeypatch, device, kernel):
    """'auto' runs the blocked kernel on CPU tensors; with CUDA's policy
    FlexAttention (torch >= 2.6), else the folded SDPA."""
    ran = []
    for name in ('attention_blocked', 'attention_sdpa',
                 'attention_materialized', 'attention_flex'):
        real = flex_attention_dense if name == 'attention_flex' else getattr(
            aa_conv, name)
        monkeypatch.setattr(
            aa_conv,
            name,
            lambda *a, real=real, name=name: ran.append(name) or real(*a))
    q, k, v, th, tw, _ = aa_inputs(0)
    with forced_device_policy(device):
        aa_conv.relative_attention(q, k, v, th, tw, 12, 10)
    assert ran[0] == kernel


@pytest.mark.parametrize('dtype', LOW)
def test_fused_aa_kernel_runs_on_the_autocast_dtype_within_pytorchs_sdpa_error(
        dtype, monkeypatch):
    """relative_attention(impl='sdpa') under autocast: the fused SDPA runs on
    the autocast dtype (spied), and output and gradients (q, k, v, both tables)
    are within 1.1x of PyTorch's SDPA error on the same attention (relative
    logits as an additive mask) against the float64 loop reference."""
    H, W = 12, 10
    q, k, v, th, tw, gout = aa_inputs(0)
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v, th, tw)]
    ref = [
        t.detach() for t in _grads(
            attention_reference(*ref_inputs, H, W), gout, ref_inputs)
    ]
    ran = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        aa_conv.F, 'scaled_dot_product_attention',
        lambda q, *a, **kw: ran.append(q.dtype) or real(q, *a, **kw))
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    ths, tws = (t.float().requires_grad_() for t in (th, tw))
    with torch.autocast('cpu', dtype=dtype):
        out = aa_conv.relative_attention(
            qs, ks, vs, ths, tws, H, W, impl='sdpa')
    monkeypatch.undo()
    assert ran == [dtype] and out.dtype == dtype
    ours = _grads(out, gout, (qs, ks, vs, ths, tws))
    qt, kt, vt = (t.to(dtype).requires_grad_() for t in (q, k, v))
    tht, twt = (t.float().requires_grad_() for t in (th, tw))
    rel_h, rel_w = aa_conv.relative_logits(
        qt.float().unflatten(2, (H, W)),
        *relative_embeddings([tht, twt], [H, W]))
    # [B, Nh, HW, HW]
    bias = (rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)).flatten(-2)
    torchs = _grads(
        F.scaled_dot_product_attention(
            qt, kt, vt, attn_mask=bias.to(dtype), scale=1.0), gout,
        (qt, kt, vt, tht, twt))
    for name, a, b, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'),
                             ours, torchs, ref):
        assert rel_err(a, r) <= 1.1 * rel_err(b, r), (name, rel_err(a, r),
                                                      rel_err(b, r))


@pytest.mark.parametrize('dtype', LOW)
def test_gsa_module_under_autocast_against_the_loop_reference(dtype):
    """The GSA module under autocast computes in bf16 (fp16 inputs too);
    forward and backward (input and every parameter) within bf16's error of the
    float64 loop reference written from the paper's equations."""
    torch.manual_seed(0)
    gsa = GlobalSelfAttention2d(
        16, 16, num_heads=2, max_rel_dist=8).double().train()
    with torch.no_grad():
        # positional terms as large as the content term
        gsa.rel_col.mul_(4), gsa.rel_row.mul_(4)
    x = torch.randn(
        2,
        16,
        9,
        11,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(1))
    xr = x.clone().requires_grad_()
    q, k, v = gsa_qkv(gsa, xr)
    ref = gsa_reference(
        q, k, v, gsa.rel_col, gsa.rel_row,
        norm=gsa.norm_col).reshape(2, 16, 9, 11)
    gout = torch.randn_like(ref)
    ref = [
        ref.detach(), *torch.autograd.grad(
            (ref * gout).sum(), [xr] + list(gsa.parameters()))
    ]
    module, xs = gsa.float(), x.float().requires_grad_()
    with torch.autocast('cpu', dtype=dtype):
        out = module(xs)
    assert out.dtype == torch.bfloat16
    ours = [
        out, *torch.autograd.grad(
            (out.double() * gout).sum(), [xs] + list(module.parameters()))
    ]
    names = ['out', 'x'] + [n for n, _ in module.named_parameters()]
    for name, a, r in zip(names, ours, ref):
        assert rel_err(a, r) < 2e-2, (name, rel_err(a, r))


@pytest.mark.parametrize('layer', ['aa', 'gsa'])
def test_gpu_kernels_launch_as_many_ops_at_every_batch_and_size(
        layer, monkeypatch):
    """One layer's forward + backward under bf16 autocast, with the kernels
    CUDA runs (FlexAttention's dense math standing in for its fused kernel),
    dispatches the same number of ops at 2x8x8 as at 4x24x18, each counted at
    its size's second step: no loop over query blocks or chunks where a GPU
    runs it, and the index tables built once per size."""
    monkeypatch.setattr(aa_conv, 'attention_flex', flex_attention_dense)
    counts = []
    for B, H, W in ((2, 8, 8), (4, 24, 18)):
        torch.manual_seed(0)
        if layer == 'aa':
            module = AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4)
        else:
            module = GlobalSelfAttention2d(16, 16, num_heads=4)
        x = torch.randn(B, 16, H, W, requires_grad=True)
        for ops in (contextlib.nullcontext(), _Ops()):
            with forced_device_policy('cuda'), ops:
                with torch.autocast('cpu', dtype=torch.bfloat16):
                    out = module(x)
                out.float().sum().backward()
        counts.append(len(ops.ops))
    assert counts[0] == counts[1], counts


@CPU_FP16_AUTOCAST
def test_gsa_casts_once_in_and_once_out_under_fp16_autocast():
    """Under fp16 autocast GSA computes in bf16: its activations change dtype
    once forward (the input to bf16, for the qkv conv) and, in the backward,
    once back (the input's gradient to fp16) after the loss's gradient comes
    in, parameters' casts aside."""
    module = GlobalSelfAttention2d(16, 16, num_heads=4).train()
    x = torch.randn(2, 16, 9, 11).half().requires_grad_()

    class Casts(TorchDispatchMode):

        def __init__(self):
            super().__init__()
            self.casts = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # activations and their gradients (batch 2), no parameters
            if (func.__name__.split('.')[0] == '_to_copy'
                    and args[0].dim() >= 4 and args[0].shape[0] == 2
                    and out.dtype != args[0].dtype):
                self.casts.append((args[0].dtype, out.dtype))
            return out

    forward, backward = Casts(), Casts()
    with forward, torch.autocast('cpu', dtype=torch.float16):
        out = module(x)
    loss = out.float().sum()
    with backward:
        loss.backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert forward.casts == [(torch.float16, torch.bfloat16)], forward.casts
    assert backward.casts == [(torch.float32, torch.bfloat16),
                              (torch.bfloat16, torch.float16)], backward.casts


@pytest.mark.skipif(
    not HAS_FLEX_ATTENTION,
    reason='FlexAttention with gradients of its score_mod needs torch >= 2.6')
def test_flex_traced_in_a_graph_matches_eager_flex():
    """Traced with ``dynamic=True``, ``fullgraph=True`` (CUDA's choices
    forced; FlexAttention's forward, which the CPU runs), the AA layer gives
    eager's output at two sizes from one graph: the relative logits' factor,
    symbolic in the graph, reaches them through the tables instead of the
    score_mod."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    module = AAConv2d(16, 32, 3, num_heads=2, min_key_dim_per_head=8).eval()
    compiled = torch.compile(
        module, fullgraph=True, dynamic=True, backend='aot_eager')
    inputs = [torch.randn(2, 16, H, W) for H, W in ((7, 9), (12, 10))]
    with forced_device_policy('cuda'), torch.no_grad():
        outs = [compiled(x) for x in inputs]
        # before eager FlexAttention on the CPU compiles graphs of its own
        assert counters['stats']['unique_graphs'] == 1
        for x, out in zip(inputs, outs):
            torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(
    not HAS_FLEX_ATTENTION, reason='FlexAttention needs torch >= 2.6')
@pytest.mark.parametrize('H,W,max_dist', [(5, 7, 4), (17, 12, 9), (1, 1, 3)])
@pytest.mark.parametrize('dtype',
                         [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_flex_kernel_matches_loop_reference(H, W, max_dist, dtype):
    """FlexAttention's fused kernel, compiled as eager CUDA callers get it:
    output and gradients (q, k, v and both tables, the latter through the
    kernel's own gradients of its score_mod's tensors) against the float64
    loop, in float32 and under autocast, offsets clipped or not, AA-ResNet-50's
    head dims (20 and 3)."""
    q, k, v, th, tw, gout = aa_inputs(0, H=H, W=W, max_dist=max_dist)
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v, th, tw)]
    ref = [
        t.detach() for t in _grads(
            attention_reference(*ref_inputs, H, W), gout, ref_inputs)
    ]
    dev = [t.float().cuda().requires_grad_() for t in (q, k, v, th, tw)]
    with torch.autocast('cuda', dtype=dtype, enabled=dtype != torch.float32):
        out = aa_conv.relative_attention(*dev[:3], *dev[3:], H, W, impl='flex')
    ours = [t.cpu() for t in _grads(out, gout.cuda(), dev)]
    # TF32 in float32
    bound = {
        torch.float32: 5e-3,
        torch.bfloat16: 3e-2,
        torch.float16: 5e-3
    }[dtype]
    for name, a, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'),
                          ours, ref):
        assert rel_err(a, r) < bound, (name, rel_err(a, r))


@pytest.mark.cuda
@pytest.mark.parametrize('kind', ['aa', 'gsa'])
def test_cuda_layer_compiles_to_one_graph_and_matches_the_reference(kind):
    """The compile smoke test of benchmarks/gpu_check.sh: one AA and one GSA
    layer, ``torch.compile(fullgraph=True, dynamic=True)`` with inductor on a
    GPU (FlexAttention's fused kernel for AA where torch has it), at two sizes:
    one graph, and output and gradients (input and every parameter) within
    TF32's error of the same layer's float64 forward on the CPU."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    if kind == 'aa':  # 4 heads of 20 key and 4 value channels
        layer = AAConv2d(
            64, 64, 3, key_ratio=1.25, value_ratio=0.25, num_heads=4)
    else:
        layer = GlobalSelfAttention2d(64, 64, num_heads=4)
    reference = copy.deepcopy(layer).double().train()
    compiled = torch.compile(
        layer.cuda().train(), fullgraph=True, dynamic=True)
    for H, W in ((13, 11), (20, 17)):
        x = torch.randn(2, 64, H, W, dtype=torch.float64)
        results = []
        for module, fn, xs in ((reference, reference, x.clone()),
                               (layer, compiled, x.float().cuda())):
            xs.requires_grad_()
            out = fn(xs)
            gout = torch.cos(
                torch.arange(out.numel(), dtype=out.dtype,
                             device=out.device)).view_as(out)
            grads = torch.autograd.grad((out * gout).sum(),
                                        [xs] + list(module.parameters()))
            results.append([out.detach().cpu()] + [g.cpu() for g in grads])
        names = ['out', 'x'] + [n for n, _ in layer.named_parameters()]
        for name, a, r in zip(names, results[1], results[0]):
            assert rel_err(a, r) < 5e-3, (name, H, W, rel_err(a, r))
    assert counters['stats']['unique_graphs'] == 1


@pytest.mark.cuda
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_cuda_gsa_layer_compiles_fullgraph_under_autocast(dtype):
    """GSA under fp16 autocast computes in bfloat16 where the GPU has it: that
    device query is made outside the traced code, so ``fullgraph=True`` traces
    one graph on a GPU under either autocast dtype."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    layer = GlobalSelfAttention2d(64, 64, num_heads=4).cuda().train()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    with torch.autocast('cuda', dtype=dtype):
        out = compiled(
            torch.randn(2, 64, 13, 11, device='cuda', requires_grad=True))
    out.float().square().mean().backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert counters['stats']['unique_graphs'] == 1
