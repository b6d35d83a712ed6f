"""GSA off its training conditions: the ``axial_scale`` forms of the axial sums
(the default ``'trained'``: the paper's sums up to the trained length, rescaled
beyond it), and a short-trained GSA-ResNet evaluated at twice its training
size."""
import pytest
import torch

from aa_det.models.layers import GlobalSelfAttention2d


def _pair(components, form, **kwargs):
    """A ``'sum'`` (paper) module and one of ``form`` with the same weights,
    float64."""
    torch.manual_seed(0)
    paper = GlobalSelfAttention2d(
        8, 8, num_heads=2, components=components, axial_scale='sum',
        **kwargs).double()
    other = GlobalSelfAttention2d(
        8, 8, num_heads=2, components=components, axial_scale=form,
        **kwargs).double()
    other.load_state_dict(paper.state_dict())
    return paper, other


def _learn(module, H, W):
    """One learning pass at ``H x W`` (records the trained lengths), then
    evaluation mode."""
    module.train()
    module(torch.randn(2, 8, H, W, dtype=torch.float64)).sum().backward()
    return module.eval()


@pytest.mark.parametrize('components, axis', [(('column', ), -2),
                                              (('row', ), -1)])
def test_axial_mean_divides_the_axial_sum_by_the_axis_length(components, axis):
    x = torch.randn(2, 8, 5, 7, dtype=torch.float64)
    paper, mean = _pair(components, 'mean')
    torch.testing.assert_close(mean(x) * x.shape[axis], paper(x))


@pytest.mark.parametrize('components, axis', [(('column', ), -2),
                                              (('row', ), -1)])
def test_trained_scale_is_the_papers_up_to_the_trained_length_rescaled_beyond(
        components, axis):
    """Trained at 6x9: the paper's sums in the learning pass and at every
    length up to 6 (column) / 9 (row); beyond, the sum times trained length /
    length."""
    paper, trained = _pair(components, 'trained')
    x = torch.randn(2, 8, 6, 9, dtype=torch.float64)
    paper.train(), trained.train()
    # a learning pass: exactly the paper's
    torch.testing.assert_close(trained(x), paper(x))
    _learn(paper, 6, 9), _learn(trained, 6, 9)
    T = 6 if axis == -2 else 9
    for H, W in ((6, 9), (4, 5), (15, 20)):
        x = torch.randn(1, 8, H, W, dtype=torch.float64)
        L = x.shape[axis]
        with torch.no_grad():
            torch.testing.assert_close(
                trained(x),
                paper(x) * (T / L if L > T else 1))


def test_trained_scale_without_a_record_is_the_paper():
    paper, trained = _pair(('content', 'column', 'row'), 'trained')
    x = torch.randn(1, 8, 40, 30, dtype=torch.float64)
    paper.eval(), trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(trained(x), paper(x))


@pytest.mark.parametrize('form, ratio', [('sum', 16.0), ('mean', 1.0),
                                         ('trained', 1.0)])
def test_axial_scale_and_the_output_scale_across_sizes(form, ratio):
    """Constant input and tables, trained at 8x8: the summed positional branch
    grows with H * W from 8x8 to 32x32; the averaged one, and the one rescaled
    beyond the trained length, do not."""
    torch.manual_seed(0)
    gsa = GlobalSelfAttention2d(
        8, 8, num_heads=2, components=('column', 'row'),
        axial_scale=form).double()
    gsa.offset_range.trained = [7, 7]  # what a learning pass at 8x8 records
    gsa.eval()
    with torch.no_grad():
        gsa.rel_col.fill_(1.0)
        gsa.rel_row.fill_(1.0)
        small, large = (
            gsa(torch.ones(1, 8, s, s, dtype=torch.float64)) for s in (8, 32))
    torch.testing.assert_close(large.abs().mean() / small.abs().mean(),
                               torch.tensor(ratio, dtype=torch.float64))


def test_unknown_axial_scale_is_refused():
    with pytest.raises(
            ValueError,
            match=r"axial_scale must be one of \('trained', 'sum', 'mean'\), "
            r"got 'avg'"):
        GlobalSelfAttention2d(8, 8, num_heads=2, axial_scale='avg')


@pytest.mark.parametrize('form', ['trained', 'mean'])
def test_short_trained_gsa_resnet_is_finite_at_twice_its_training_size(form):
    """20 SGD steps at 32x32 (a short run), then eval at 64x64 with the running
    statistics of 32x32. With the paper's sums at every size such a run can
    reach ~1e62 in stage 4 (float64; docs/design.md); rescaled beyond the
    trained length (the default) or averaged, every stage stays within 10x of
    its size at 32x32."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(
        dict(
            type='GSAResNet',
            depth=26,
            base_channels=8,
            norm_eval=False,
            attention=dict(num_heads=2, axial_scale=form)))
    model.init_weights()
    head = torch.nn.Linear(model.feat_dim, 4)
    # lr 0.01: at 0.02 the short run itself diverged (NaN at 1x) with 2 threads
    # and not with 1
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()],
                          lr=0.01,
                          momentum=0.9,
                          weight_decay=1e-4)

    # a bright square in one of four quadrants; the label is the quadrant
    def quadrant_task(batch, size):
        x, y = torch.randn(batch, 3, size, size) * 0.5, torch.randint(
            0, 4, (batch, ))
        for i, label in enumerate(y.tolist()):
            r, c = divmod(label, 2)
            x[i, :, r * size // 2:r * size // 2 + size // 4,
              c * size // 2:c * size // 2 + size // 4] += 2
        return x, y

    model.train()
    for _ in range(20):
        x, y = quadrant_task(4, 32)
        loss = torch.nn.functional.cross_entropy(
            head(model(x)[-1].mean((2, 3))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        at_1x, at_2x = (model(quadrant_task(4, size)[0]) for size in (32, 64))
    for small, large in zip(at_1x, at_2x):
        assert torch.isfinite(large).all()
        assert large.abs().max() < 10 * small.abs().max()
