"""Test maps larger than the training maps use only relative-table rows that
trained (issue: any size)."""
import copy

import pytest
import torch

from aa_det.models.backbones import AAResNet, GSAResNet
from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.models.layers.relative_position import TrainedOffsetRange

BACKBONES = {
    'AAResNet':
    lambda: AAResNet(
        depth=18,
        base_channels=16,
        attention=dict(num_heads=2, min_key_dim_per_head=4, max_rel_dist=16)),
    'GSAResNet':
    lambda: GSAResNet(
        depth=26,
        base_channels=8,
        attention=dict(num_heads=2, max_rel_dist=16)),
}


def _tables(model):
    return {
        name: p
        for name, p in model.named_parameters()
        if name.rsplit('.', 1)[-1] in ('rel_h', 'rel_w', 'rel_col', 'rel_row')
    }


def _train(model, size, steps, seen):
    """A few SGD steps at ``size``; ``seen[name]`` accumulates |grad| of every
    table."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        sum(o.square().mean()
            for o in model(torch.randn(2, 3, *size))).backward()
        for name, p in _tables(model).items():
            seen[name] = seen.get(name, 0) + p.grad.abs().sum(-1)
        opt.step()


@pytest.mark.parametrize('backbone', sorted(BACKBONES))
def test_untrained_table_rows_never_reach_larger_test_maps(backbone):
    """Pretrain at 32x32 (ImageNet-like), save, load into a fresh model (the
    detector's backbone or a resumed run), train on at 64x48 crops; then every
    table row that never got a gradient is perturbed and the outputs at 160x128
    stay the same."""
    torch.manual_seed(0)
    seen = {}
    pretrained = BACKBONES[backbone]()
    _train(pretrained, (32, 32), 2, seen)
    model = BACKBONES[backbone]()
    # strict: the records travel too
    model.load_state_dict(copy.deepcopy(pretrained.state_dict()))
    _train(model, (64, 48), 2, seen)

    model.eval()
    x = torch.randn(1, 3, 160, 128)
    with torch.no_grad():
        before = model(x)
        untrained = 0
        for name, p in _tables(model).items():
            rows = seen[name] == 0
            untrained += int(rows.sum())
            p[rows] += 10 * torch.randn_like(p[rows])
        after = model(x)
    assert untrained > 0  # the larger map reaches beyond the trained offsets
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # Without the record (the behaviour before it existed) the perturbed rows
    # are used.
    for m in model.modules():
        if isinstance(m, TrainedOffsetRange):
            m.reset()
    with torch.no_grad():
        assert any(not torch.allclose(a, b) for a, b in zip(before, model(x)))


@pytest.mark.parametrize(
    'layer', [
        lambda: AAConv2d(
            8, 16, key_ratio=0.5, value_ratio=0.5, num_heads=2, max_rel_dist=8
        ),
        lambda: GlobalSelfAttention2d(8, 8, num_heads=2, max_rel_dist=8),
    ],
    ids=['AAConv2d', 'GSA'])
def test_record_follows_learning_passes_and_state_dict(layer):
    torch.manual_seed(0)
    m = layer()
    assert m.offset_range.trained == [-1, -1]
    m.eval()
    m(torch.randn(1, 8, 6, 5))  # evaluation records nothing
    m.train()
    with torch.no_grad():
        # no gradient: nothing learns, nothing recorded
        m(torch.randn(1, 8, 6, 5))
    assert m.offset_range.trained == [-1, -1]
    m(torch.randn(1, 8, 4, 3))
    m(torch.randn(1, 8, 3, 6))
    assert m.offset_range.trained == [3, 5]  # largest offset per axis
    m(torch.randn(1, 8, 20, 20))
    # beyond max_rel_dist: the clip rows train
    assert m.offset_range.trained == [19, 19]

    state = m.state_dict()
    assert state['offset_range._extra_state'].tolist() == [19, 19]
    fresh = layer()
    fresh.load_state_dict(state)
    assert fresh.offset_range.trained == [19, 19]
    # A checkpoint from before the record existed loads strictly, as 'nothing
    # recorded'.
    old = {k: v for k, v in state.items() if not k.endswith('_extra_state')}
    fresh.load_state_dict(old)
    assert fresh.offset_range.trained == [-1, -1]


def test_within_the_trained_range_outputs_are_unchanged():
    """At or below the training size the cropped tables give exactly eq.
    (3)."""
    torch.manual_seed(0)
    conv = AAConv2d(
        8, 16, key_ratio=0.5, value_ratio=0.5, num_heads=2,
        max_rel_dist=8).double()
    # trains offsets up to (4, 3)
    conv(torch.randn(1, 8, 5, 4, dtype=torch.float64))
    conv.eval()
    x = torch.randn(2, 8, 5, 4, dtype=torch.float64)
    cropped = conv(x)
    conv.offset_range.reset()  # the whole table
    torch.testing.assert_close(cropped, conv(x), rtol=0, atol=0)
