"""What a GPU runs, run on the CPU: AA's fused ``'sdpa'`` kernel (``impl='sdpa'``, CUDA's choice) on the
autocast dtype, with the float16 fold scale, and GSA's bfloat16 products under autocast, forward and backward,
against the float64 loop references. Errors are bounded as in tests/test_low_precision.py: by PyTorch's own
SDPA error on the same inputs and dtype.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.models.layers import aa_conv
from aa_det.models.layers.relative_position import relative_embeddings

from attention_inputs import aa_inputs, rel_err
from kernel_references import attention_reference, gsa_qkv, gsa_reference
from torch_versions import CPU_FP16_AUTOCAST

LOW = [torch.bfloat16, pytest.param(torch.float16, marks=CPU_FP16_AUTOCAST)]


class _Ops(TorchDispatchMode):
    """The aten ops that launch a kernel (as benchmarks/op_counts.py counts them: no views, allocations)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split('.')[0]
        if not func.is_view and isinstance(out, (torch.Tensor, tuple, list)) and \
                name not in ('detach', 'empty', 'empty_like', 'empty_strided'):
            self.ops.append(name)
        return out


def _grads(out, gout, inputs):
    return [out, *torch.autograd.grad((out.double() * gout).sum(), inputs)]


def test_auto_picks_blocked_on_the_cpu(monkeypatch):
    """'auto' on CPU tensors runs the blocked kernel (CUDA tensors and captured graphs: 'sdpa')."""
    ran = []
    for name in ('attention_blocked', 'attention_sdpa', 'attention_materialized'):
        real = getattr(aa_conv, name)
        monkeypatch.setattr(aa_conv, name, lambda *a, real=real, name=name: ran.append(name) or real(*a))
    q, k, v, th, tw, _ = aa_inputs(0)
    aa_conv.relative_attention(q, k, v, th, tw, 12, 10)
    assert ran[0] == 'attention_blocked'


@pytest.mark.parametrize('dtype', LOW)
def test_fused_aa_kernel_runs_on_the_autocast_dtype_within_pytorchs_sdpa_error(dtype, monkeypatch):
    """relative_attention(impl='sdpa') under autocast: the fused SDPA runs on the autocast dtype (spied), and
    output and gradients (q, k, v, both tables) are within 1.1x of PyTorch's SDPA error on the same attention
    (relative logits as an additive mask) against the float64 loop reference."""
    H, W = 12, 10
    q, k, v, th, tw, gout = aa_inputs(0)
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v, th, tw)]
    ref = [t.detach() for t in _grads(attention_reference(*ref_inputs, H, W), gout, ref_inputs)]
    ran = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(aa_conv.F, 'scaled_dot_product_attention', lambda q, *a, **kw: ran.append(q.dtype) or
                        real(q, *a, **kw))
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    ths, tws = (t.float().requires_grad_() for t in (th, tw))
    with torch.autocast('cpu', dtype=dtype):
        out = aa_conv.relative_attention(qs, ks, vs, ths, tws, H, W, impl='sdpa')
    monkeypatch.undo()
    assert ran == [dtype] and out.dtype == dtype
    ours = _grads(out, gout, (qs, ks, vs, ths, tws))
    qt, kt, vt = (t.to(dtype).requires_grad_() for t in (q, k, v))
    tht, twt = (t.float().requires_grad_() for t in (th, tw))
    rel_h, rel_w = aa_conv.relative_logits(qt.float().unflatten(2, (H, W)), relative_embeddings(tht, H),
                                           relative_embeddings(twt, W))
    bias = (rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)).flatten(-2)  # [B, Nh, HW, HW]
    torchs = _grads(F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias.to(dtype), scale=1.0), gout,
                    (qt, kt, vt, tht, twt))
    for name, a, b, r in zip(('out', 'dq', 'dk', 'dv', 'dtable_h', 'dtable_w'), ours, torchs, ref):
        assert rel_err(a, r) <= 1.1 * rel_err(b, r), (name, rel_err(a, r), rel_err(b, r))


@pytest.mark.parametrize('dtype', LOW)
def test_gsa_module_under_autocast_against_the_loop_reference(dtype):
    """The GSA module under autocast computes in bf16 (fp16 inputs too); forward and backward (input and every
    parameter) within bf16's error of the float64 loop reference written from the paper's equations."""
    torch.manual_seed(0)
    gsa = GlobalSelfAttention2d(16, 16, num_heads=2, max_rel_dist=8).double().train()
    with torch.no_grad():
        gsa.rel_col.mul_(4), gsa.rel_row.mul_(4)  # positional terms as large as the content term
    x = torch.randn(2, 16, 9, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    xr = x.clone().requires_grad_()
    q, k, v = gsa_qkv(gsa, xr)
    ref = gsa_reference(q, k, v, gsa.rel_col, gsa.rel_row, norm=gsa.norm_col).reshape(2, 16, 9, 11)
    gout = torch.randn_like(ref)
    ref = [ref.detach(), *torch.autograd.grad((ref * gout).sum(), [xr] + list(gsa.parameters()))]
    module, xs = gsa.float(), x.float().requires_grad_()
    with torch.autocast('cpu', dtype=dtype):
        out = module(xs)
    assert out.dtype == torch.bfloat16
    ours = [out, *torch.autograd.grad((out.double() * gout).sum(), [xs] + list(module.parameters()))]
    names = ['out', 'x'] + [n for n, _ in module.named_parameters()]
    for name, a, r in zip(names, ours, ref):
        assert rel_err(a, r) < 2e-2, (name, rel_err(a, r))


@pytest.mark.parametrize('layer', ['aa', 'gsa'])
def test_gpu_kernels_launch_as_many_ops_at_every_batch_and_size(layer):
    """One layer's forward + backward under bf16 autocast, with the kernels CUDA runs, dispatches the same number
    of ops at 2x8x8 as at 4x24x18: no loop over query blocks or chunks where a GPU runs it."""
    counts = []
    for B, H, W in ((2, 8, 8), (4, 24, 18)):
        torch.manual_seed(0)
        if layer == 'aa':
            module = AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4, impl='sdpa')
        else:
            module = GlobalSelfAttention2d(16, 16, num_heads=4)
        x = torch.randn(B, 16, H, W, requires_grad=True)
        ops = _Ops()
        with ops:
            with torch.autocast('cpu', dtype=torch.bfloat16):
                out = module(x)
            out.float().sum().backward()
        counts.append(len(ops.ops))
    assert counts[0] == counts[1], counts


@CPU_FP16_AUTOCAST
def test_gsa_casts_once_in_and_once_out_under_fp16_autocast():
    """Under fp16 autocast GSA computes in bf16: its activations change dtype once forward (the input to bf16, for
    the qkv conv) and, in the backward, once back (the input's gradient to fp16) after the loss's gradient comes in,
    parameters' casts aside."""
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

    forward, backward = Casts(), Casts()
    with forward, torch.autocast('cpu', dtype=torch.float16):
        out = module(x)
    loss = out.float().sum()
    with backward:
        loss.backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert forward.casts == [(torch.float16, torch.bfloat16)], forward.casts
    assert backward.casts == [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16)], backward.casts
