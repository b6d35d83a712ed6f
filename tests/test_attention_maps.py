"""The attention maps of ``demo/vis_attention.py``
(``demo/attention_maps.py``): applied to the values, they reproduce the layers'
forward outputs."""
import os.path as osp
import sys

import pytest
import torch
from kernel_references import gsa_qkv

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.models.layers.aa_conv import relative_attention

sys.path.insert(
    0, osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'demo'))
from attention_maps import attention_weights  # noqa: E402

QUERIES = torch.tensor([[0, 0], [2, 3], [4, 5]])


def test_aa_maps_are_the_softmax_weights_the_forward_uses():
    torch.manual_seed(0)
    conv = AAConv2d(
        8, 16, 3, key_channels=8, value_channels=8,
        num_heads=2).double().eval()
    x = torch.randn(1, 8, 5, 6, dtype=torch.float64)
    # [1, Nh, P, 5, 6], float32 for drawing
    maps = attention_weights(conv, x, QUERIES)['attention'].double()
    q, k, v, (h, w) = conv.qkv_heads(x)
    # [1, Nh, hw, dvh]
    attn = relative_attention(
        q, k, v, conv.rel_h, conv.rel_w, h, w, scale=conv.scale)
    assert torch.allclose(
        maps.sum((-1, -2)), torch.ones(1, 2, 3, dtype=torch.float64))
    torch.testing.assert_close(
        maps.flatten(-2) @ v,
        attn[:, :, QUERIES[:, 0] * w + QUERIES[:, 1]],
        rtol=1e-5,
        atol=1e-6)


def _applied(maps, v):
    # [1, C, P]
    return torch.einsum('bnpij,bncij->bncp', maps, v).reshape(1, 8, 3)


def test_gsa_maps_are_the_weights_the_forward_applies_to_the_values():
    torch.manual_seed(0)
    x = torch.randn(1, 8, 5, 6, dtype=torch.float64)
    for components, key in ((('content', ), 'content'), (('column', 'row'),
                                                         'positional')):
        gsa = GlobalSelfAttention2d(
            8, 8, num_heads=2, components=components).double().eval()
        expected = _applied(
            attention_weights(gsa, x, QUERIES)[key],
            gsa_qkv(gsa, x)[2])
        # the eval-mode BN between column and row: x / sqrt(1 + eps)
        if key == 'positional':
            expected = expected / (1 + gsa.norm_col.eps)**0.5
        torch.testing.assert_close(
            gsa(x)[0, :, QUERIES[:, 0], QUERIES[:, 1]], expected[0])


@pytest.mark.parametrize('form', ['mean', 'trained'])
def test_gsa_maps_carry_the_axial_scale(form):
    """At 5x6 after training at 3x4: ``'trained'`` rescales both axes."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, 5, 6, dtype=torch.float64)
    gsa = GlobalSelfAttention2d(
        8, 8, num_heads=2, components=('column', 'row'),
        axial_scale=form).double().eval()
    # what a learning pass at 3x4 records (the norm keeps its fresh statistics)
    gsa.offset_range.trained = [2, 3]
    expected = _applied(
        attention_weights(gsa, x, QUERIES)['positional'],
        gsa_qkv(gsa, x)[2])
    torch.testing.assert_close(
        gsa(x)[0, :, QUERIES[:, 0], QUERIES[:, 1]],
        expected[0] / (1 + gsa.norm_col.eps)**0.5)
