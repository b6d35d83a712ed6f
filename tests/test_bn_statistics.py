"""BatchNorm at test time: the head that shares BatchNorms across FPN levels is
named at start-up, and tools/analysis_tools/bn_check.py evaluates a checkpoint
with running and with batch statistics."""
import os.path as osp
import re

import pytest
import torch
import torch.nn.functional as F
from bn_statistics import RunningStatisticsGap, batch_statistics
from demo_config import DEMO, ROOT, demo_options
from mmdet.registry import MODELS
from tool_process import run_python

from aa_det.engine.hooks import shared_head_norms

BN = dict(type='BN', requires_grad=True)
HEAD = dict(
    num_classes=3,
    in_channels=16,
    feat_channels=16,
    stacked_convs=2,
    norm_cfg=BN)
#: the demo detector with mmdet's RetinaHead: its 4 BatchNorms run on all 5 FPN
#: levels
RETINA_HEAD_CONFIG = f"""_base_ = {DEMO!r}
model = dict(bbox_head=dict(
    _delete_=True, type='RetinaHead', num_classes=3, in_channels=64, feat_channels=64, stacked_convs=2,
    norm_cfg=dict(type='BN', requires_grad=True),
    anchor_generator=dict(type='AnchorGenerator', octave_base_scale=2, scales_per_octave=3,
                          ratios=[0.5, 1.0, 2.0], strides=[8, 16, 32, 64, 128]),
    bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.0] * 4, target_stds=[1.0] * 4),
    loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=1.0),
    loss_bbox=dict(type='L1Loss', loss_weight=1.0)))
"""  # noqa: E501


def test_shared_head_norms_finds_retina_heads_batchnorms_only():
    head = MODELS.build(dict(type='RetinaHead', **HEAD)).train()
    before = [
        m.running_mean.clone() for m in head.modules()
        if isinstance(m, torch.nn.BatchNorm2d)
    ]
    assert shared_head_norms(head) == [(f'{b}_convs.{i}.bn', 5)
                                       for b in ('cls', 'reg')
                                       for i in range(2)]
    # modes as they were
    assert head.training and all(m.training for m in head.modules())
    after = [
        m.running_mean for m in head.modules()
        if isinstance(m, torch.nn.BatchNorm2d)
    ]
    # statistics untouched
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert shared_head_norms(
        MODELS.build(dict(type='RetinaSepBNHead', num_ins=5, **HEAD))) == []
    gn = dict(HEAD, norm_cfg=dict(type='GN', num_groups=4))
    assert shared_head_norms(MODELS.build(dict(type='RetinaHead', **gn))) == []


def test_batch_statistics_normalise_with_the_batch_leave_running_statistics():
    bn = torch.nn.BatchNorm2d(4).eval()
    with torch.no_grad():
        bn.running_mean.fill_(5.0)
        bn.weight.uniform_(0.5, 2)
    x = torch.randn(3, 4, 6, 6) * 2 + 1
    with batch_statistics(bn):
        inside = bn(x)
    expected = F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0,
                            bn.eps)
    torch.testing.assert_close(inside, expected)
    assert torch.equal(bn.running_mean, torch.full(
        (4, ), 5.0)) and int(bn.num_batches_tracked) == 0
    torch.testing.assert_close(
        bn(x),
        F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias))


def test_running_statistics_gap_measures_the_normalised_inputs_mean_and_std():
    bn = torch.nn.BatchNorm2d(8).eval()
    x = torch.randn(4, 8, 16, 16)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    with torch.no_grad():
        # inputs 2 running stds above the running mean
        bn.running_mean.copy_(mean - 2 * var.sqrt())
        bn.running_var.copy_(var / 9)  # and 3x as spread
    model = torch.nn.Sequential(bn)
    with RunningStatisticsGap(model) as gap, torch.no_grad():
        model(x)
        model(x)
    [(name, calls, shift, scale)] = gap.table()
    assert (name, calls) == ('0', 2)
    assert shift == pytest.approx(
        6.0, rel=1e-3) and scale == pytest.approx(
            3.0, rel=1e-3)


@pytest.mark.slow  # 15-35 s of training; .ci/run runs it
def test_train_names_a_shared_batchnorm_head_and_bn_check_measures_both(
        tiny_shapes, tmp_path):
    """tools/train.py warns in one line about RetinaHead's shared BatchNorms;
    the check tool on its checkpoint prints the two mAPs and the head's
    BatchNorms applied once per level."""
    config = tmp_path / 'retina_head_bn.py'
    config.write_text(RETINA_HEAD_CONFIG)
    opts = demo_options(
        tiny_shapes, **{
            'train_cfg.max_epochs': 1,
            'train_dataloader.batch_size': 4,
            'train_cfg.val_interval': 10,
            'model.test_cfg.score_thr': 0.0
        })
    options = ['--cfg-options'] + [f'{k}={v}' for k, v in opts.items()]
    train = run_python([
        osp.join(ROOT, 'tools/train.py'), config, '--work-dir',
        tmp_path / 'work', *options
    ],
                       cwd=ROOT)
    assert train.returncode == 0, train.stderr[-3000:]
    warnings = [
        line for line in (train.stdout + train.stderr).splitlines()
        if 'FPN levels' in line
    ]
    assert len(warnings) == 1, warnings
    assert ('model.bbox_head (RetinaHead) applies each of its 4 BatchNorms to '
            'all 5 FPN levels' in warnings[0])
    assert "type='RetinaSepBNHead' with num_ins=5" in warnings[
        0] and 'bn_check.py' in warnings[0]

    check = run_python([
        osp.join(ROOT, 'tools/analysis_tools/bn_check.py'), config,
        tmp_path / 'work' / 'epoch_1.pth', '--top', '1000', '--work-dir',
        tmp_path / 'check', *options
    ],
                       cwd=ROOT)
    assert check.returncode == 0, check.stderr[-3000:]
    out = check.stdout
    assert re.search(
        r'running statistics .*:\s+mAP=\d\.\d{3}  mAP_50=\d\.\d{3}  mAP_75=',
        out), out
    assert re.search(
        r'batch statistics .*:\s+mAP=\d\.\d{3}  mAP_50=\d\.\d{3}  mAP_75=',
        out), out
    rows = dict(
        re.findall(r'^  (\S+)  +applied (\S+)x per forward', out,
                   re.MULTILINE))
    assert rows['bbox_head.cls_convs.0.bn'] == '5' and rows[
        'backbone.bn1'] == '1', out
