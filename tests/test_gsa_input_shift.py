"""GSA off its training conditions (issue 20): the ``axial_mean`` option, and a short-trained
GSA-ResNet evaluated at twice its training size."""
import pytest
import torch

from aa_det.models.layers import GlobalSelfAttention2d


@pytest.mark.parametrize('components, axis', [(('column',), -2), (('row',), -1)])
def test_axial_mean_divides_the_axial_sum_by_the_axis_length(components, axis):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 7, dtype=torch.float64)
    gsa = GlobalSelfAttention2d(8, 8, num_heads=2, components=components).double()
    mean = GlobalSelfAttention2d(8, 8, num_heads=2, components=components, axial_mean=True).double()
    mean.load_state_dict(gsa.state_dict())
    torch.testing.assert_close(mean(x) * x.shape[axis], gsa(x))


def test_axial_mean_keeps_the_output_scale_across_sizes():
    """Constant input and tables: the averaged positional branch is the same at 8x8 and 32x32,
    the summed one grows with H * W."""
    torch.manual_seed(0)
    for axial_mean, ratio in ((False, 16.0), (True, 1.0)):
        gsa = GlobalSelfAttention2d(8, 8, num_heads=2, components=('column', 'row'),
                                    axial_mean=axial_mean).double().eval()
        with torch.no_grad():
            gsa.rel_col.fill_(1.0)
            gsa.rel_row.fill_(1.0)
        small, large = (gsa(torch.ones(1, 8, s, s, dtype=torch.float64)) for s in (8, 32))
        torch.testing.assert_close(large.abs().mean() / small.abs().mean(),
                                   torch.tensor(ratio, dtype=torch.float64))


def test_axial_mean_attention_weights_reproduce_the_outputs():
    torch.manual_seed(0)
    x = torch.randn(1, 8, 5, 6, dtype=torch.float64)
    queries = torch.tensor([[0, 0], [2, 3], [4, 5]])
    gsa = GlobalSelfAttention2d(8, 8, num_heads=2, components=('column', 'row'),
                                axial_mean=True).double().eval()
    _, _, v = gsa.qkv_heads(x)
    maps = gsa.attention_weights(x, queries)['positional']
    expected = torch.einsum('bnpij,bncij->bncp', maps, v).reshape(1, 8, 3) / (1 + gsa.norm_col.eps) ** 0.5
    torch.testing.assert_close(gsa(x)[0, :, queries[:, 0], queries[:, 1]], expected[0])


def test_short_trained_gsa_resnet_is_finite_at_twice_its_training_size():
    """20 SGD steps at 32x32 (a short run, as in the issue), then eval at 64x64 with the running
    statistics of 32x32. With the paper's sums such a run can reach ~1e62 in stage 4 (float64;
    docs/design.md); with ``axial_mean`` every stage stays within 10x of its size at 32x32."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(dict(type='GSAResNet', depth=26, base_channels=8, norm_eval=False,
                              attention=dict(num_heads=2, axial_mean=True)))
    model.init_weights()
    head = torch.nn.Linear(model.feat_dim, 4)
    # lr 0.01: at 0.02 the short run itself diverged (NaN at 1x) with 2 threads and not with 1
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01, momentum=0.9, weight_decay=1e-4)

    def quadrant_task(batch, size):  # a bright square in one of four quadrants; the label is the quadrant
        x, y = torch.randn(batch, 3, size, size) * 0.5, torch.randint(0, 4, (batch,))
        for i, label in enumerate(y.tolist()):
            r, c = divmod(label, 2)
            x[i, :, r * size // 2:r * size // 2 + size // 4, c * size // 2:c * size // 2 + size // 4] += 2
        return x, y

    model.train()
    for _ in range(20):
        x, y = quadrant_task(4, 32)
        loss = torch.nn.functional.cross_entropy(head(model(x)[-1].mean((2, 3))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        at_1x, at_2x = (model(quadrant_task(4, size)[0]) for size in (32, 64))
    for small, large in zip(at_1x, at_2x):
        assert torch.isfinite(large).all()
        assert large.abs().max() < 10 * small.abs().max()
