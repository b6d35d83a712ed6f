"""benchmarks/op_counts.py: its counts on fake tensors are those on real
tensors, its stand-in for AA's FlexAttention computes eq. (3) and counts the
padded kernel's FLOPs, and each op belongs to the module that runs it."""
import os.path as osp
import sys

import pytest
import torch
from attention_inputs import aa_inputs

from aa_det.models.layers.device_policy import HAS_FLEX_ATTENTION

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'benchmarks'))
try:
    import op_counts
# torch 2.1: no torch.utils.flop_counter.register_flop_formula
except ImportError as e:
    pytest.skip(
        f'benchmarks/op_counts.py needs a newer torch: {e}',
        allow_module_level=True)


@pytest.mark.parametrize('name', ['AA-ResNet-50', 'GSA-ResNet-50'])
def test_fake_tensors_count_what_real_tensors_count(name):
    """At 96x64 (W x H; maps of 4x6 and 2x3 in stages 3 and 4: no axis of
    length 1, where meta kernels and the CPU's choose different strides for a
    size-1 dim), bf16, CUDA policy: the same ops, FLOPs, ops by kind and per
    attention layer, and the attention kernels' FLOPs (AA's only), on fake as
    on real tensors (ResNet-50's layers are in both); bytes and peak within
    0.1% (the meta kernel's batch-norm statistics are in the input's dtype, the
    CPU's in float32: one ``[C]`` vector per norm)."""
    fake, real = (
        op_counts.measure(name, (64, 96), 1, dtype=torch.bfloat16, fake=fake)
        for fake in (True, False))
    assert fake['table'] == real['table']
    assert fake['flops'] == real['flops']
    # AA's attention runs in one kernel per layer; GSA's products are GEMMs
    assert fake['attention_flops'] == real['attention_flops']
    assert (fake['attention_flops'] > 0) == name.startswith('AA')
    assert fake['layers'] == real['layers']
    assert {k: v['ops']
            for k, v in fake['kinds'].items()
            } == {k: v['ops']
                  for k, v in real['kinds'].items()}
    for key in ('bytes', 'peak'):
        assert fake[key] == pytest.approx(real[key], rel=1e-3), key


def _reference(q, k, v, table_h, table_w, H, W):
    """Eq. (3) written per (query, key) pair: float64 logits
    ``q_i . k_j + q_i . r^H[h_j - h_i] + q_i . r^W[w_j - w_i]`` (offsets
    clipped to the tables), softmax, values."""
    M = (table_h.shape[0] + 1) // 2
    pos = [(i // W, i % W) for i in range(H * W)]
    clip = [[min(max(b - a, 1 - M), M - 1) + M - 1 for b in range(max(H, W))]
            for a in range(max(H, W))]
    # [N, N, d]
    r_h = table_h[torch.tensor([[clip[hi][hj] for hj, _ in pos]
                                for hi, _ in pos])]
    r_w = table_w[torch.tensor([[clip[wi][wj] for _, wj in pos]
                                for _, wi in pos])]
    logits = q @ k.transpose(-1, -2) + torch.einsum('bnid,ijd->bnij', q,
                                                    r_h + r_w)
    return logits.softmax(-1) @ v


@pytest.mark.skipif(
    not HAS_FLEX_ATTENTION, reason="AA's 'flex' kernel needs torch >= 2.6")
def test_flex_stand_in_computes_eq3_with_its_gradients():
    """AA's 'flex' kernel with ``attention_flex`` replaced by the stand-in
    (op_counts.cuda_kernels): output and gradients of q, k, v and both tables
    as eq. (3)'s float64 reference, offsets clipped (tables of 3 offsets a side
    on a 5x7 map); the stand-in is one op forward and one backward."""
    from aa_det.models.layers import aa_conv
    H, W = 5, 7
    q, k, v, table_h, table_w, grad = aa_inputs(
        0, B=1, Nh=2, H=H, W=W, max_dist=3)
    inputs = [t.requires_grad_() for t in (q, k, v, table_h, table_w)]
    expected = torch.autograd.grad(_reference(*inputs, H, W), inputs, grad)
    counter = op_counts.OpCounter()
    with op_counts.cuda_kernels(), counter:
        out = aa_conv.relative_attention(*inputs, H, W, impl='flex')
        got = torch.autograd.grad(out, inputs, grad)
    assert out.detach().allclose(_reference(*inputs, H, W), atol=1e-5)
    for g, e in zip(got, expected):
        assert g.allclose(e, atol=1e-5)
    assert counter.ops['flex_attention'] == counter.ops[
        'flex_attention_backward'] == 1


def test_flex_flops_count_the_padded_head_dims():
    """FlexAttention's FLOPs on the head dims its Triton kernel computes: d_k
    20 -> 32, d_v 3 -> 16; the backward's two passes take seven products, the
    logits recomputed in each."""
    B, Nh, N = 2, 4, 15
    q, v = torch.empty(
        B, Nh, N, 20, device='meta'), torch.empty(
            B, Nh, N, 3, device='meta')
    assert [op_counts.flex_head_dim(d)
            for d in (3, 16, 20, 32, 40)] == [16, 16, 32, 32, 64]
    forward = op_counts.flop_formula(
        torch.ops.aa_bench.flex_attention.default)(
            q, q, v, None, None, 1.0, out_val=v)
    backward = op_counts.flop_formula(
        torch.ops.aa_bench.flex_attention_backward.default)(
            v, q, q, v, None, None, 1.0, out_val=(q, q, v))
    assert forward == 2 * B * Nh * N * N * (32 + 16)
    assert backward == 2 * B * Nh * N * N * (4 * 32 + 3 * 16)


def test_ops_belong_to_the_module_that_runs_them():
    """ResNet-50's ``layer3.0.conv2`` (a 3x3 conv under bf16 autocast): its
    weight's cast and the convolution forward, the convolution's backward and
    the weight gradient's cast back; with ``with_cp`` its forward again in the
    backward. Every op of the count belongs to one module (or the model)."""
    for with_cp, (forward, backward) in ((False, (2, 2)), (True, (2, 4))):
        r = op_counts.measure(
            'ResNet-50', (64, 64), 1, dtype=torch.bfloat16, with_cp=with_cp)
        layer = r['layers']['layer3.0.conv2']
        assert (layer['ops_forward'],
                layer['ops_backward']) == (forward, backward), with_cp
        assert layer['kinds'] == dict(
            gemm=(forward + backward) // 2,
            cast=(forward + backward) // 2,
            layout=0,
            index=0,
            elementwise=0)
        assert sum(kind['ops'] for kind in r['kinds'].values()) == r['ops']


def test_sizes_are_width_by_height_and_padded_as_mmdet_pads():
    """``--size 1333x800`` is mmdet's scale, width first: an 800 x 1333 (H x W)
    input, padded to 800 x 1344."""
    assert op_counts.parse_size('640') == (640, 640)
    assert op_counts.parse_size('1333x800') == (800, 1333)
    assert op_counts.padded((800, 1333), 32) == (800, 1344)
