"""AAResNet / GSAResNet: shapes, mmdet ResNet semantics, parameter counts of
the papers, what they say of weights nothing loaded."""
import re

import pytest
import torch
from mmdet.registry import MODELS

import aa_det  # noqa: F401
from aa_det.models.layers import AAConv2d
from aa_det.utils.compat import TORCH_VERSION


def build(type_, depth, mode=None, **kwargs):
    model = MODELS.build(dict(type=type_, depth=depth, **kwargs))
    if mode is not None:
        # mmdet's ResNet.train() returns None: no chaining
        model.train(mode == 'train')
    return model


def params_with_head(model):
    """Parameters counted as torchvision's resnet50 (25.56M): trunk + 1000-way
    fc."""
    return sum(p.numel()
               for p in model.parameters()) + model.feat_dim * 1000 + 1000


# (type, depth, kwargs, paper's count in millions, source)
PAPER_COUNTS = [
    ('ResNet', 50, {}, 25.6, 'AA Table 2'),
    ('AAResNet', 34, {}, 20.7, 'AA Table 2'),
    ('AAResNet', 50, {}, 25.8, 'AA Table 2'),
    ('AAResNet', 101, {}, 45.4, 'AA Table 2'),
    ('AAResNet', 152, {}, 61.6, 'AA Table 2'),
    ('AAResNet', 50, dict(attention=dict(key_ratio=0.25, value_ratio=0.25)),
     24.3, 'AA Table 5'),
    ('AAResNet', 50, dict(attention=dict(key_ratio=0.5, value_ratio=0.5)),
     22.3, 'AA Table 5'),
    ('AAResNet', 50, dict(attention=dict(key_ratio=0.75, value_ratio=0.75)),
     20.7, 'AA Table 5'),
    ('AAResNet', 50, dict(attention=dict(key_ratio=1.0, value_ratio=1.0)),
     19.4, 'AA Table 5'),
    ('GSAResNet', 38, {}, 14.2, 'GSA Table 6'),
    ('GSAResNet', 50, {}, 18.1, 'GSA Table 6'),
    ('GSAResNet', 101, {}, 30.4, 'GSA Table 6'),
]


@pytest.mark.parametrize('type_,depth,kwargs,paper,source', PAPER_COUNTS)
def test_parameter_counts_reproduce_papers(type_, depth, kwargs, paper,
                                           source):
    n = params_with_head(build(type_, depth, **kwargs)) / 1e6
    assert n == pytest.approx(
        paper,
        rel=0.01), f'{type_}-{depth} {kwargs}: {n:.2f}M vs {paper}M ({source})'


@pytest.mark.parametrize('type_,depth',
                         [('AAResNet', d) for d in (18, 34, 50, 101, 152)] +
                         [('GSAResNet', d) for d in (26, 38, 50, 101)])
def test_every_depth_runs_at_odd_sizes(type_, depth):
    model = build(type_, depth, mode='eval')
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 200, 333))
    expansion = model.block.expansion
    sizes = [(50, 84), (25, 42), (13, 21), (7, 11)]
    assert [tuple(o.shape) for o in outs] == [(1, 64 * 2**i * expansion, *s)
                                              for i, s in enumerate(sizes)]


@pytest.mark.parametrize('type_,depth', [('AAResNet', 18), ('GSAResNet', 26)])
def test_out_indices_frozen_stages_norm_eval(type_, depth):
    model = build(
        type_, depth, out_indices=(1, 3), frozen_stages=1, norm_eval=True)
    model.train()
    assert len(model(torch.rand(1, 3, 64, 48))) == 2
    for name in ('conv1', 'bn1', 'layer1'):
        assert all(not p.requires_grad
                   for p in getattr(model, name).parameters())
    for name in ('bn1', 'layer1'):
        assert all(not m.training for m in getattr(model, name).modules())
    assert all(p.requires_grad for p in model.layer2.parameters())
    bns = [
        m for m in model.modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
    ]
    assert bns and all(not m.training for m in bns)
    model = build(type_, depth, mode='train', norm_eval=False)
    assert all(m.training for m in model.modules())


@pytest.mark.parametrize('type_,depth', [('AAResNet', 50), ('GSAResNet', 26)])
def test_with_cp_same_outputs_gradients_and_statistics(type_, depth):
    """``with_cp=True`` (aa_det.models.blocks.BlockCheckpoint): the step's
    gradients and BatchNorm statistics are those without it. mmdet's reentrant
    checkpoint ran every BatchNorm twice per step (``num_batches_tracked`` 2,
    momentum 0.1 acting as 0.19) and warned about ``use_reentrant`` in every
    block; AA-ResNet-50's first stage has mmdet's plain blocks."""
    import warnings
    torch.manual_seed(0)
    ref = build(type_, depth, norm_eval=False)
    cp = build(type_, depth, norm_eval=False, with_cp=True)
    cp.load_state_dict(ref.state_dict())
    x = torch.rand(2, 3, 64, 80)
    for model in (ref, cp):
        model.train()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            sum(o.mean() for o in model(x)).backward()
        assert not [w for w in caught if 'use_reentrant' in str(w.message)]
    scale = max(p.grad.abs().max() for p in ref.parameters())
    for (name, a), b in zip(ref.named_parameters(), cp.parameters()):
        # biases right before a BN have ~0 true gradient: compare against the
        # global scale
        assert (a.grad - b.grad).abs().max() <= 1e-4 * scale, name
    buffers = dict(cp.named_buffers())
    for name, a in ref.named_buffers():
        torch.testing.assert_close(buffers[name], a, msg=name)
    assert int(buffers['layer1.0.bn1.num_batches_tracked']) == 1


def test_gsa_layers_evaluated_once_per_step_twice_with_cp(monkeypatch):
    """Per training step (forward + backward) every GSA layer is evaluated
    once, and with ``with_cp=True`` twice (the forward and the block's one
    recomputation), with the same outputs and gradients: ``with_cp`` is the one
    memory-for-time trade, and the layer adds no recomputation of its own."""
    from collections import Counter

    from aa_det.models.layers import GlobalSelfAttention2d
    calls = Counter()
    attention = GlobalSelfAttention2d.attention

    def counted(self, x):
        calls[self] += 1
        return attention(self, x)

    monkeypatch.setattr(GlobalSelfAttention2d, 'attention', counted)
    torch.manual_seed(0)
    ref = build('GSAResNet', 26, base_channels=16, norm_eval=False)
    cp = build(
        'GSAResNet', 26, base_channels=16, norm_eval=False, with_cp=True)
    cp.load_state_dict(ref.state_dict())
    layers = [m for m in ref.modules() if isinstance(m, GlobalSelfAttention2d)]
    assert len(layers) == 8  # ResNet-26: (1, 2, 4, 1) blocks, every stage
    x = torch.rand(2, 3, 64, 80)
    outs, grads = [], []
    for model, evaluations in ((ref, 1), (cp, 2)):
        model.train()
        calls.clear()
        out = model(x)
        assert set(calls.values()) == {1}
        sum(o.mean() for o in out).backward()
        gsa = [
            m for m in model.modules() if isinstance(m, GlobalSelfAttention2d)
        ]
        assert [calls[m] for m in gsa] == [evaluations] * len(gsa)
        outs.append(out)
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize('type_,depth', [('AAResNet', 50), ('AAResNet', 34),
                                         ('GSAResNet', 38)])
def test_every_parameter_gets_a_gradient_and_state_dict_round_trips(
        type_, depth):
    model = build(type_, depth, mode='train', norm_eval=False)
    sum(o.mean() for o in model(torch.rand(2, 3, 64, 96))).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert (
        not missing
    ), f'no gradient (DDP would need find_unused_parameters): {missing}'
    fresh = build(type_, depth)
    result = fresh.load_state_dict(model.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.rand(1, 3, 64, 64)
    model.eval()
    fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), fresh(x))


def test_zero_init_residual_applies_to_attention_blocks():
    for type_, depth, last in (('AAResNet', 34, 'norm2'),
                               ('AAResNet', 50, 'norm3'), ('GSAResNet', 26,
                                                           'norm3')):
        model = build(type_, depth)
        model.init_weights()
        assert getattr(model.layer4[0], last).weight.abs().sum() == 0


def test_attention_layers_sit_where_the_papers_put_them():
    from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
    aa = build('AAResNet', 50)
    assert not isinstance(aa.layer1[0].conv2, AAConv2d)
    assert all(
        isinstance(b.conv2, AAConv2d)
        for layer in (aa.layer2, aa.layer3, aa.layer4) for b in layer)
    assert [
        aa.layer2[0].conv2.attn_downsample, aa.layer3[0].conv2.attn_downsample
    ] == [True, False]
    aa34 = build('AAResNet', 34)
    assert isinstance(aa34.layer2[0].conv1, AAConv2d) and not isinstance(
        aa34.layer2[0].conv2, AAConv2d)
    gsa = build('GSAResNet', 50)
    assert all(
        isinstance(b.conv2, GlobalSelfAttention2d)
        for layer in (gsa.layer1, gsa.layer4) for b in layer)
    assert [
        gsa.layer1[0].conv2.stride, gsa.layer2[0].conv2.stride,
        gsa.layer2[1].conv2.stride
    ] == [1, 2, 1]


def test_aa_with_dcn_on_the_same_stage():
    """mmdet's DCN in stage 4 and attention in stages 2-4: stage 4's conv2 is
    concat[DCN(X), MHA(X)]."""
    from mmcv.ops import DeformConv2dPack

    from aa_det.models.layers import AAConv2d
    model = build(
        'AAResNet',
        50,
        dcn=dict(type='DCN', deform_groups=1, fallback_on_stride=False),
        stage_with_dcn=(False, False, False, True))
    assert all(isinstance(b.conv2, AAConv2d) for b in model.layer2)
    assert all(
        isinstance(b.conv2.conv, DeformConv2dPack) for b in model.layer4)
    assert not isinstance(model.layer3[0].conv2.conv, DeformConv2dPack)
    # a config dump shows each apart
    assert 'dcn' not in str(model.attention) and model.dcn['type'] == 'DCN'
    # mmcv's DCN needs maps of at least its kernel
    outs = model(torch.rand(1, 3, 128, 96))
    assert outs[-1].shape == (1, 2048, 4, 3)
    outs[-1].sum().backward()
    assert model.layer4[0].conv2.conv.conv_offset.weight.grad is not None


def test_gsa_with_a_plugin_and_dcn_refused():
    # (registers mmdet's plugins)
    from mmdet.models.layers import ResLayer  # noqa: F401
    model = build(
        'GSAResNet',
        26,
        plugins=[
            dict(
                cfg=dict(type='ContextBlock', ratio=1. / 4),
                stages=(False, False, True, True),
                position='after_conv3')
        ])
    assert model.layer3[0].after_conv3_plugin_names == [
        'context_block'
    ] and model.layer2[0].after_conv3_plugin_names == []
    assert type(model.layer3[0].conv2).__name__ == 'GlobalSelfAttention2d'
    out = model(torch.rand(1, 3, 64, 64))
    assert out[-1].shape == (1, 2048, 2, 2)
    with pytest.raises(
            ValueError,
            match='GSAResNet: dcn and GSA both replace conv2 in stage'):
        build(
            'GSAResNet',
            26,
            dcn=dict(type='DCN', deform_groups=1),
            stage_with_dcn=(False, False, False, True))


def test_checkpoint_keys_unchanged():
    """State-dict keys and shapes as written by the released layout
    (tests/fixtures), so older checkpoints load with no missing or unexpected
    keys."""
    import json
    import os.path as osp
    ref = json.load(
        open(
            osp.join(
                osp.dirname(__file__), 'fixtures',
                'backbone_state_dict_keys.json')))
    for name, (type_, depth) in {
            'AAResNet-18': ('AAResNet', 18),
            'AAResNet-50': ('AAResNet', 50),
            'GSAResNet-26': ('GSAResNet', 26)
    }.items():
        state = build(type_, depth).state_dict()
        assert {k: list(v.shape) for k, v in state.items()} == ref[name], name


@pytest.mark.slow  # 45-90 s: every row of the tool; .ci/run runs it
def test_complexity_tool_matches_papers_tables():
    """tools/analysis_tools/complexity.py: every row's parameters within 1% and
    GFLOPs within 5% of the paper's (one exception)."""
    import os.path as osp

    from tool_process import run_python
    tool = osp.join(
        osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools',
        'analysis_tools', 'complexity.py')
    out = run_python([tool])
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert len(rows) == 14
    with open(
            osp.join(osp.dirname(tool), '..', '..', 'docs', 'benchmarks.md'),
            encoding='utf-8') as f:
        # docs/benchmarks.md's table is what the tool prints today
        assert out.stdout.strip() in f.read()
    for row in rows:
        # source is 2 words
        params_ratio, flops_ratio = float(row[-6]), float(row[-3])
        assert abs(params_ratio - 1) <= 0.01, row
        # AA-WRN: exact attention over all 32x32 positions with 160-dim keys
        # costs 12.5 GFLOPs where AA Table 1 says 10.9 (README); every other
        # row within 5%
        assert abs(flops_ratio -
                   1) <= 0.05 or row[0] == 'AA-Wide-ResNet-28-10', row


@pytest.mark.parametrize(
    'attention, paper_m',
    [
        (None, 36.3),  # Wide-ResNet-28-10, AA Table 1
        # AA-Wide-ResNet
        (dict(
            key_ratio=0.2,
            value_ratio=0.1,
            num_heads=8,
            min_key_dim_per_head=20), 36.2),
    ])
def test_wide_resnet_parameters_reproduce_aa_table1(attention, paper_m):
    net = MODELS.build(
        dict(
            type='WideResNet', depth=28, widen_factor=10, attention=attention))
    # + 100-way fc
    params = sum(p.numel()
                 for p in net.parameters()) + net.feat_dim * 100 + 100
    assert abs(params / 1e6 / paper_m - 1) < 0.01, params
    assert sum(isinstance(m, AAConv2d)
               for m in net.modules()) == (12 if attention else 0)


def test_wide_resnet_runs_and_trains_every_parameter():
    net = MODELS.build(
        dict(
            type='WideResNet',
            depth=10,
            widen_factor=2,
            out_indices=(0, 1, 2),
            attention=dict(num_heads=2, min_key_dim_per_head=4)))
    outs = net(torch.rand(2, 3, 33, 31))
    assert [tuple(o.shape) for o in outs] == [(2, 32, 33, 31), (2, 64, 17, 16),
                                              (2, 128, 9, 8)]
    sum(o.mean() for o in outs).backward()
    assert all(p.grad is not None for p in net.parameters())
    with pytest.raises(ValueError, match='depth=12'):
        MODELS.build(dict(type='WideResNet', depth=12))


def _initialised(tmp_path=None, checkpoint=None, **kwargs):
    """A small AA-ResNet-18 with mmdet ResNet's defaults (``norm_eval=True``)
    after ``init_weights``, from ``checkpoint`` (a state dict saved into
    ``tmp_path``) through ``init_cfg`` Pretrained."""
    init_cfg = None
    if checkpoint is not None:
        path = str(tmp_path / 'pretrained.pth')
        torch.save(checkpoint, path)
        init_cfg = dict(
            type='Pretrained', checkpoint=path, **kwargs.pop('pretrained', {}))
    model = build(
        'AAResNet',
        18,
        base_channels=16,
        attention=dict(num_heads=2, min_key_dim_per_head=4),
        init_cfg=init_cfg,
        **kwargs)
    model.init_weights()
    return model


@pytest.fixture
def warnings_logged(monkeypatch):
    """The messages the backbones log as warnings."""
    from aa_det.models.backbones import unloaded_weights
    logged = []
    monkeypatch.setattr(
        unloaded_weights,
        'print_log',
        lambda msg, logger=None, level=None: logged.append(msg))
    return logged


def test_frozen_weights_nothing_loaded_are_one_warning_and_a_hooks_refusal(
        warnings_logged):
    """mmdet's ``frozen_stages=1``, ``norm_eval=True``, nothing loaded:
    ``train()`` never raises (as ``nn.Module.train``) and warns once, naming
    the settings and tensors; the hooks' check refuses it."""
    from aa_det.models.backbones.unloaded_weights import refuse_frozen_unloaded
    from aa_det.utils import ConfigError
    model = _initialised(frozen_stages=1)
    line = ((
        r'model.backbone \(AAResNet\): frozen_stages=1, norm_eval=True '
        r'freeze \d+ tensors \(0.\d\dM parameters\) at their random '
        r'initialisation: no init_cfg Pretrained, load_from or resume loaded '
        r'them \(first: conv1.weight; .*\); to train from scratch set '
        r'frozen_stages=-1, .*'))
    with pytest.raises(ConfigError, match=f'^{line}$'):
        refuse_frozen_unloaded(model)
    model.train()
    model.train()
    assert len(warnings_logged) == 1 and re.fullmatch(
        f'aa_det: {line}', warnings_logged[0]), warnings_logged
    model = _initialised(frozen_stages=-1, norm_eval=False)
    refuse_frozen_unloaded(model)
    model.train()
    assert len(warnings_logged) == 1


def test_classifier_checkpoint_without_its_prefix_names_the_prefix(
        tmp_path, warnings_logged):
    """An mmpretrain classifier's checkpoint (``backbone.*``, ``head.*``) in
    ``init_cfg`` without ``prefix='backbone.'`` loads nothing: the refusal and
    the warning say so and name the prefix."""
    from aa_det.models.backbones.unloaded_weights import refuse_frozen_unloaded
    from aa_det.utils import ConfigError
    own = _initialised(frozen_stages=-1, norm_eval=False).state_dict()
    classifier = dict(
        state_dict={
            **{f'backbone.{k}': v
               for k, v in own.items()}, 'head.fc.weight': torch.ones(3, 128)
        })
    fix = ((r"init_cfg Pretrained \S+pretrained.pth holds them under the key "
            r"prefix 'backbone.' \(an mmpretrain classifier's keys\), which "
            r"init_cfg does not strip"))
    with pytest.raises(
            ConfigError,
            match=rf'freeze \d+ tensors \(0.\d\dM parameters\) at their '
            rf'random '
            rf"initialisation: {fix} \(first: conv1.weight; .*\); add "
            rf"prefix='backbone.' "
            r'to init_cfg \(docs/detection.md, "Swapping into your own '
            r'config"\)$'):
        refuse_frozen_unloaded(
            _initialised(tmp_path, classifier, frozen_stages=1))
    _initialised(
        tmp_path, classifier, frozen_stages=-1, norm_eval=False).train()
    assert len(warnings_logged) == 1 and re.search(
        rf"left \d+ tensors .* \({fix}: add prefix='backbone.' to "
        r'init_cfg; docs/detection.md', warnings_logged[0]), warnings_logged
    model = _initialised(
        tmp_path,
        classifier,
        frozen_stages=1,
        pretrained=dict(prefix='backbone.'))
    refuse_frozen_unloaded(model)
    model.train()
    assert len(warnings_logged) == 1


@pytest.mark.skipif(
    TORCH_VERSION < (2, 6),
    reason="torch.load's safe loading by default needs torch >= 2.6")
def test_pretrained_checkpoint_safe_loading_refuses_names_the_converter(
        tmp_path):
    """A classifier checkpoint mmengine's Runner wrote without
    SafeCheckpointHook (its MessageHub's ``HistoryBuffer``): one line naming
    the file and the converter, not torch's page of advice."""
    from mmengine.logging import HistoryBuffer

    from aa_det.utils import ConfigError
    checkpoint = dict(
        state_dict={},
        message_hub=dict(log_scalars={'loss': HistoryBuffer([0.5], [1])}))
    with pytest.raises(
            ConfigError,
            match=r'^checkpoint file cannot be loaded: \S+pretrained.pth: it '
            r'holds Python objects that safe loading refuses \(GLOBAL '
            r'mmengine.logging.history_buffer.HistoryBuffer\); if you '
            r'trust the file, convert it: python '
            r'tools/convert_checkpoint.py OLD NEW$'):
        _initialised(tmp_path, checkpoint, pretrained=dict(prefix='backbone.'))
