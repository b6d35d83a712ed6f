"""Every ResNet / model setting honoured or refused, and config mistakes caught
before training: backbone settings through the registry, config checks through
our tools' load_config + build_runner (the Runner and the hooks the config
names) and tools/train.py."""
import os
import os.path as osp

import pytest
import torch
from config_checks import check_model_config
from config_runner import build_runner, load_config
from data_edits import assert_stops_before_training
from demo_config import DEMO, ROOT, demo_options
from mmcv.cnn.bricks.conv_ws import ConvWS2d
from mmdet.registry import MODELS
from synthetic_shapes import generate_shapes_coco
from tool_process import run_python

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.utils import ConfigError

TINY_AA = dict(
    type='AAResNet',
    base_channels=8,
    attention=dict(num_heads=2, min_key_dim_per_head=2))
WS_GN = dict(
    conv_cfg=dict(type='ConvWS'),
    norm_cfg=dict(type='GN', num_groups=2, requires_grad=True))


@pytest.fixture(scope='module')
def tiny_shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes_coco(str(root), num_train=4, num_val=2, image_size=64)
    return root


# --- conv_cfg ----------------------------------------------------------------


@pytest.mark.parametrize('depth, conv', [(18, 'conv1'), (50, 'conv2')])
def test_aa_conv_part_follows_conv_cfg(depth, conv):
    """mmdet's gn+ws (``conv_cfg=dict(type='ConvWS')``): the convolutional half
    of every AA conv is a ConvWS, in basic blocks and bottlenecks, as every
    other conv of the network."""
    model = MODELS.build(dict(TINY_AA, depth=depth, **WS_GN))
    aa = [m for m in model.modules() if isinstance(m, AAConv2d)]
    assert aa and all(type(m.conv) is ConvWS2d for m in aa)
    # a plain stage, mmdet's own
    assert type(getattr(model.layer1[0], conv)) is ConvWS2d
    assert model(torch.rand(1, 3, 32, 32))[-1].shape[1] == model.feat_dim


def test_dcn_wins_over_the_attention_configs_conv_cfg():
    model = MODELS.build(
        dict(
            TINY_AA,
            depth=50,
            attention=dict(TINY_AA['attention'], conv_cfg=dict(type='ConvWS')),
            dcn=dict(type='DCN', deform_groups=1),
            stage_with_dcn=(False, False, False, True)))
    assert type(model.layer3[0].conv2.conv) is ConvWS2d
    assert type(model.layer4[0].conv2.conv).__name__ == 'DeformConv2dPack'


@pytest.mark.parametrize('fallback', [False, True])
def test_dcn_fallback_on_stride_as_in_mmdets_resnet(fallback):
    """``fallback_on_stride``: AA's convolutional half is a DCN exactly where
    mmdet's ResNet with the same ``dcn`` has a DCN ``conv2``, and a plain conv
    (the block's ``conv_cfg``) where it falls back."""

    def build(cfg):
        return MODELS.build(
            dict(
                cfg,
                depth=50,
                base_channels=8,
                stage_with_dcn=(False, True, True, True),
                dcn=dict(
                    type='DCN', deform_groups=1, fallback_on_stride=fallback)))

    resnet, aa = build(dict(type='ResNet')), build(TINY_AA)
    stages = [(getattr(resnet, name), getattr(aa, name))
              for name in aa.res_layers[1:]]
    kinds = [(type(r.conv2).__name__, type(a.conv2.conv).__name__)
             for rs, as_ in stages for r, a in zip(rs, as_)]
    assert all(r == a for r, a in kinds), kinds
    assert ('Conv2d',
            'Conv2d') in kinds if fallback else all(a == 'DeformConv2dPack'
                                                    for _, a in kinds)
    # DCN needs maps >= its 3x3
    assert aa(torch.rand(1, 3, 128, 128))[-1].shape[1] == aa.feat_dim


def test_gsa_resnet_takes_conv_cfg_for_its_convs():
    model = MODELS.build(
        dict(
            type='GSAResNet',
            depth=26,
            base_channels=8,
            attention=dict(num_heads=2),
            **WS_GN))
    assert type(
        model.stem[0] if hasattr(model, 'stem') else model.conv1) is ConvWS2d
    assert type(model.layer1[0].conv1) is ConvWS2d and type(
        model.layer1[0].conv3) is ConvWS2d
    assert isinstance(model.layer1[0].conv2, GlobalSelfAttention2d)


# --- per-stage settings ------------------------------------------------------


@pytest.mark.parametrize(
    'settings, error',
    [
        (dict(stage_with_attention=(False, True, True, True, True)),
         r'stage_with_attention=\(False, True, True, True, True\) has 5 '
         r'entries; it needs one per stage, num_stages=4'),
        (dict(stage_with_attention=(False, True, True)),
         r'stage_with_attention=\(False, True, True\) has 3 entries; it needs '
         r'one per stage, num_stages=4'),
        (dict(num_stages=5), 'num_stages=5 must be 1 to 4'),
        (dict(num_stages=0), 'num_stages=0 must be 1 to 4'),
        # mmdet's defaults for four stages, which its ResNet refused with a
        # bare assert
        (dict(num_stages=3, stage_with_attention=(False, True, True)),
         r'strides=\(1, 2, 2, 2\) has 4 entries; it needs one per stage, '
         r'num_stages=3'),
        (dict(
            num_stages=3,
            stage_with_attention=(False, True, True),
            strides=(1, 2, 2),
            dilations=(1, 1, 1)),
         r'out_indices=\(0, 1, 2, 3\) is empty or names a stage past the last '
         r'\(num_stages=3: stages 0 to 2\)'),
        (dict(out_indices=()),
         r'out_indices=\(\) is empty or names a stage past the last '
         r'\(num_stages=4'),
        # mmdet's ResNet stopped in _freeze_stages: AttributeError 'layer5'
        (dict(frozen_stages=5),
         r'frozen_stages=5 freezes more stages than num_stages=4'),
    ])
@pytest.mark.parametrize('backbone', ['AAResNet', 'GSAResNet'])
def test_per_stage_settings_need_one_entry_per_stage(backbone, settings,
                                                     error):
    cfg = dict(
        TINY_AA, depth=18) if backbone == 'AAResNet' else dict(
            type='GSAResNet',
            depth=26,
            base_channels=8,
            attention=dict(num_heads=2))
    with pytest.raises(ValueError, match=f'^{backbone}: {error}'):
        MODELS.build(dict(cfg, **settings))


def test_attn_downsample_stages_need_one_entry_per_stage():
    with pytest.raises(
            ValueError,
            match=r'^AAResNet: attn_downsample_stages=\(False, True\) has 2 '
            r'entries'):
        MODELS.build(
            dict(TINY_AA, depth=18, attn_downsample_stages=(False, True)))


@pytest.mark.parametrize('backbone', [
    dict(TINY_AA, depth=18),
    dict(
        type='GSAResNet',
        depth=26,
        base_channels=8,
        attention=dict(num_heads=2))
])
def test_mmdets_three_stage_pattern_builds_with_the_default_attention_stages(
        backbone):
    """mmdet's ``num_stages=3`` pattern without ``stage_with_attention``: the
    default follows ``num_stages`` (was refused: the default had four entries),
    outputs as mmdet's ResNet's."""
    three = dict(
        num_stages=3,
        strides=(1, 2, 2),
        dilations=(1, 1, 1),
        out_indices=(0, 1, 2))
    model = MODELS.build(dict(backbone, **three))
    resnet = MODELS.build(
        dict(
            type='ResNet',
            depth=backbone['depth'] if backbone['depth'] != 26 else 50,
            base_channels=8,
            **three))
    x = torch.rand(1, 3, 32, 32)
    assert [o.shape for o in model(x)] == [o.shape for o in resnet(x)]
    assert len(
        model.stage_with_attention) == 3 and model.stage_with_attention[-1]


def test_three_stages_with_three_entries_build():
    model = MODELS.build(
        dict(
            TINY_AA,
            depth=18,
            num_stages=3,
            strides=(1, 2, 2),
            dilations=(1, 1, 1),
            out_indices=(0, 1, 2),
            stage_with_attention=(False, True, True)))
    assert [tuple(o.shape)
            for o in model(torch.rand(1, 3, 32, 32))] == [(1, 8, 8, 8),
                                                          (1, 16, 4, 4),
                                                          (1, 32, 2, 2)]


@pytest.mark.parametrize('settings, error', [
    (dict(
        dcn=dict(type='DCN', deform_groups=1),
        stage_with_dcn=(False, True, True, True)), 'dcn'),
    (dict(plugins=[
        dict(
            cfg=dict(type='ContextBlock', ratio=1. / 4),
            position='after_conv3')
    ]), 'plugins'),
])
def test_basic_block_depths_refuse_dcn_and_plugins(settings, error):
    """mmdet's BasicBlock takes neither; AA-ResNet-18/34 stopped on its bare
    ``assert``."""
    with pytest.raises(
            ValueError,
            match=rf'^AAResNet: depth=34 builds basic blocks, which take no '
            rf'{error} '
            r".*use depth 50, 101, 152 \(bottleneck blocks\)$"):
        MODELS.build(dict(TINY_AA, depth=34, **settings))


def test_mmdets_resnet_freezing_more_stages_than_it_has(tiny_shapes):
    """The ``type='ResNet'`` control stopped its build with
    ``AttributeError: 'ResNet' object has no attribute 'layer5'``; the check
    names the setting."""
    cfg = _cfg(
        tiny_shapes, **{
            'model.backbone':
            dict(_delete_=True, type='ResNet', depth=50, frozen_stages=5)
        })
    with pytest.raises(
            ConfigError,
            match=r'^model.backbone.frozen_stages=5 freezes more stages than '
            r'num_stages=4 \(ResNet; '):
        check_model_config(cfg)


def test_an_assert_outside_openmmlab_keeps_its_traceback(tiny_shapes):
    """Only OpenMMLab's own settings asserts are quoted in one line; any other
    is a bug whose traceback is kept."""

    @MODELS.register_module(force=True)
    class AssertingBackbone(torch.nn.Module):

        def __init__(self):
            super().__init__()
            assert False, 'a bug'

    cfg = _cfg(
        tiny_shapes,
        **{'model.backbone': dict(_delete_=True, type='AssertingBackbone')})
    # pytest adds the rewritten assert below it
    with pytest.raises(AssertionError, match='^a bug'):
        check_model_config(cfg)


def test_mmdets_assert_with_a_message_gives_the_message(tiny_shapes):
    """The source line of a multi-line assert is only its first: the message
    says it."""
    cfg = _cfg(
        tiny_shapes, **{
            'model.backbone':
            dict(
                _delete_=True,
                type='ResNet',
                depth=50,
                pretrained='x.pth',
                init_cfg=dict(type='Pretrained', checkpoint='x.pth'))
        })
    with pytest.raises(
            ConfigError,
            match=r'^model.backbone \(ResNet\): init_cfg and pretrained '
            r'cannot be specified at the same time \(assert at '
            r'resnet.py:\d+\)$'):
        check_model_config(cfg)


def test_mmdets_own_bare_assert_is_named_by_its_line(tiny_shapes):
    """The ``type='ResNet'`` controls are mmdet's class: its asserts carry no
    message; the check quotes the failed one."""
    cfg = _cfg(
        tiny_shapes, **{
            'model.backbone':
            dict(_delete_=True, type='ResNet', depth=50, num_stages=3)
        })
    with pytest.raises(
            ConfigError,
            match=r"^model.backbone \(ResNet\): failed 'assert len\(strides\) "
            r"== len\(dilations\) == num_stages' at resnet.py:\d+$"):
        check_model_config(cfg)


# --- AA channels -------------------------------------------------------------


def test_base_channels_without_a_conv_part_are_refused():
    """AA-R18 at base_channels=4, 8 heads: dv rounds up to 8 = the 8 channels
    of stage 2's conv."""
    with pytest.raises(
            ValueError,
            match=r'^AAResNet: base_channels=4 leaves no convolutional '
            r'channels .* use base_channels >= 5'):
        MODELS.build(dict(type='AAResNet', depth=18, base_channels=4))
    model = MODELS.build(dict(type='AAResNet', depth=18, base_channels=5))
    assert all(m.conv is not None for m in model.modules()
               if isinstance(m, AAConv2d))


def test_fully_attentional_network_stays_allowed():
    model = MODELS.build(
        dict(
            type='AAResNet',
            depth=18,
            base_channels=4,
            attention=dict(
                key_ratio=1.0, value_ratio=1.0, min_key_dim_per_head=1)))
    assert all(m.conv is None for m in model.modules()
               if isinstance(m, AAConv2d))


def test_aa_conv_without_a_conv_part_is_refused():
    with pytest.raises(
            ValueError,
            match=r'value_ratio=0.25 of out_channels=8 rounds to dv=8'):
        AAConv2d(8, 8, key_ratio=0.25, value_ratio=0.25, num_heads=8)


@pytest.mark.parametrize(
    'attention, error',
    [
        # was a ZeroDivisionError
        (dict(num_heads=0), 'num_heads must be >= 1, got 0'),
        # was 1.0
        (dict(value_ratio=1.5),
         r'value_ratio must be in \(0, 1\] \(1.0: fully attentional\), got 1.5'
         ),
        (dict(value_ratio=0), r'value_ratio must be in \(0, 1\]'),
        (dict(key_ratio=-0.2), 'key_ratio must be >= 0, got -0.2'),
        # was a TypeError in torch.empty
        (dict(max_rel_dist=32.0), 'max_rel_dist must be an int >= 1, got 32.0'
         ),
    ])
def test_aa_attention_settings_out_of_range_are_refused(attention, error):
    """Each was a traceback, or (``value_ratio`` > 1) a fully attentional
    network without a word."""
    with pytest.raises(ValueError, match=f'^AAConv2d: {error}'):
        MODELS.build(dict(type='AAResNet', depth=18, attention=attention))


def test_aa_ratios_are_not_checked_where_explicit_channels_replace_them():
    conv = AAConv2d(
        8,
        16,
        key_channels=4,
        value_channels=4,
        key_ratio=-1,
        value_ratio=0,
        num_heads=2)
    assert (conv.key_channels, conv.value_channels) == (4, 4)


def test_gsa_max_rel_dist_must_be_an_int():
    with pytest.raises(
            ValueError,
            match=r'^GlobalSelfAttention2d: max_rel_dist must be an int >= 1, '
            r'got 32.0'):
        MODELS.build(
            dict(
                type='GSAResNet', depth=26, attention=dict(max_rel_dist=32.0)))


def test_aa_dilated_stage_dilates_the_conv_part():
    """mmdet's dilated last stage (DC5: ``strides=(1, 2, 2, 1)``,
    ``dilations=(1, 1, 1, 2)``): the AA conv's convolutional half is dilated,
    its attention is global; the output size is mmdet's ResNet's."""
    dc5 = dict(
        depth=18,
        base_channels=8,
        strides=(1, 2, 2, 1),
        dilations=(1, 1, 1, 2))
    model = MODELS.build(dict(TINY_AA, **dc5))
    assert model.layer4[0].conv1.conv.dilation == (2, 2)
    x = torch.rand(1, 3, 64, 64)
    assert model(x)[-1].shape[-2:] == MODELS.build(dict(
        type='ResNet', **dc5))(x)[-1].shape[-2:]


def test_gsa_refuses_a_dilated_stage_in_one_line():
    with pytest.raises(
            ValueError,
            match=r'^GlobalSelfAttention2d: dilation=2 is not supported '
            r'\(global attention has no dilation, groups or bias\); use '
            r'dilation=1$'):
        MODELS.build(
            dict(
                type='GSAResNet',
                depth=26,
                base_channels=8,
                attention=dict(num_heads=2),
                strides=(1, 2, 2, 1),
                dilations=(1, 1, 1, 2)))


@pytest.mark.parametrize('build, error', [
    (lambda: AAConv2d(
        8, 16, 3, padding=0, num_heads=2, min_key_dim_per_head=2),
     r"^AAConv2d: padding=0 is not supported: the attention branch keeps "
     r"'same' padding, 1 for kernel_size=3"),
    (lambda: GlobalSelfAttention2d(8, 8, 3, padding=2, num_heads=2),
     r"^GlobalSelfAttention2d: kernel_size=3, padding=2 is not a 'same' "
     r"convolution's"),
    (lambda: GlobalSelfAttention2d(8, 8, 3, bias=True, num_heads=2),
     r'^GlobalSelfAttention2d: bias=True is not supported'),
    (lambda: GlobalSelfAttention2d(8, 8, 3, groups=2, num_heads=2),
     r'^GlobalSelfAttention2d: groups=2 is not supported'),
    (lambda: AAConv2d(
        8, 16, 3, impl='flash', num_heads=2, min_key_dim_per_head=2),
     r"^AAConv2d: impl must be one of \('auto', 'blocked', 'flex', 'sdpa', "
     r"'materialized'\), got 'flash'"),
])
def test_conv_arguments_the_attention_layers_do_not_honour_are_refused(
        build, error):
    with pytest.raises(ValueError, match=error):
        build()


def test_attention_layers_take_a_same_convs_arguments():
    """What mmdet's blocks pass (kernel 3, padding = dilation) and any odd
    'same' kernel build."""
    assert AAConv2d(
        8, 16, 3, padding=2, dilation=2, num_heads=2,
        min_key_dim_per_head=2).conv.padding == (2, 2)
    assert GlobalSelfAttention2d(
        8, 8, 1, padding=0, num_heads=2)(torch.rand(1, 8, 5,
                                                    6)).shape == (1, 8, 5, 6)


# --- attention keys ----------------------------------------------------------


def test_aa_keys_left_in_a_gsa_backbone_are_named():
    with pytest.raises(
            ValueError,
            match=r'^GSAResNet: attention key\(s\) min_key_dim_per_head not '
            r'taken by GlobalSelfAttention2d; allowed: .*components, '
            r'.*num_heads'):
        MODELS.build(
            dict(
                type='GSAResNet',
                depth=26,
                base_channels=8,
                attention=dict(num_heads=2, min_key_dim_per_head=8)))


@pytest.mark.parametrize('key', ['attn_downsample', 'stride', 'nonsense'])
def test_keys_the_blocks_set_or_no_layer_takes_are_refused(key):
    with pytest.raises(
            ValueError,
            match=f'^AAResNet: attention key\\(s\\) {key} not taken by '
            f'AAConv2d; allowed: .*key_ratio'):
        MODELS.build(
            dict(
                TINY_AA,
                depth=18,
                attention=dict(TINY_AA['attention'], **{key: 1})))


# --- config checks before training -------------------------------------------


def _cfg(root, **extra):
    return load_config(DEMO, cfg_options=demo_options(root, **extra))


def _stops(cfg, tmp_path, pattern, run='train'):
    """The Runner of ``cfg`` stops with ``pattern`` before its first training
    iteration."""
    cfg.work_dir = str(tmp_path / 'work')
    runner = build_runner(
        cfg, splits=('test', ) if run == 'test' else ('train', 'val', 'test'))
    assert_stops_before_training(runner, pattern, run)


def test_demo_config_passes_the_checks(tiny_shapes):
    check_model_config(_cfg(tiny_shapes))


def test_num_classes_other_than_the_datasets_classes(tiny_shapes, tmp_path):
    """mmdet's NumClassCheckHook, with one line (``EarlyNumClassCheckHook`` in
    the runtime base)."""
    _stops(
        _cfg(tiny_shapes, **{'model.bbox_head.num_classes': 2}), tmp_path,
        r'^train_dataloader.dataset: The `num_classes` \(2\) in '
        r'RetinaSepBNHead of RetinaNet does not matches the length of '
        r'`classes` 3\) in CheckedCocoDataset; set model.\*head.num_classes')


def test_num_classes_checked_for_test_only(tiny_shapes, tmp_path):
    """What mmdet's NumClassCheckHook lacks: it checks validation data when
    validation starts, never test data."""
    _stops(
        _cfg(tiny_shapes, **{'model.bbox_head.num_classes': 4}),
        tmp_path,
        r'^test_dataloader.dataset: The `num_classes` \(4\)',
        run='test')


def _mmdet_config(root, base, **extra):
    """A config file with mmdet's config ``base`` as its ``_base_`` and our
    class check added (as a user writes it), on the tiny shapes dataset and its
    3 classes."""
    split = {'train': 'train', 'val': 'val', 'test': 'val'}
    options = {
        f'{s}_dataloader.dataset.{k}': v
        for s in split
        for k, v in (('data_root', f'{root}/'),
                     ('ann_file', f'annotations/instances_{split[s]}.json'),
                     ('data_prefix', dict(img=f'{split[s]}/')),
                     ('metainfo',
                      dict(classes=('circle', 'square', 'triangle'))))
    }
    options.update({
        f'{s}_evaluator.ann_file': f'{root}/annotations/instances_val.json'
        for s in ('val', 'test')
    })
    options.update({
        f'{s}_dataloader.{k}': v
        for s in split
        for k, v in (('num_workers', 0), ('persistent_workers', False))
    })
    path = root / osp.basename(base)
    path.write_text(
        f"_base_ = {base!r}\ncustom_imports = dict(imports=['aa_det'], "
        f"allow_failed_imports=False)\ndefault_hooks = "
        f"dict(check_classes=dict(type='EarlyNumClassCheckHook'))\n")
    return load_config(str(path), cfg_options=dict(options, **extra))


@pytest.mark.parametrize('base, bbox_heads, module', [
    ('mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
     ['model.roi_head.bbox_head.num_classes'], 'FCNMaskHead'),
    ('mmdet::htc/htc-without-semantic_r50_fpn_1x_coco.py',
     [f'model.roi_head.bbox_head.{i}.num_classes'
      for i in range(3)], 'HTCMaskHead'),
])
def test_mask_head_num_classes_other_than_the_datasets_classes(
        tiny_shapes, tmp_path, base, bbox_heads, module):
    """mmdet's Mask R-CNN / HTC (a list of mask heads) with the bbox heads set
    to the 3 classes and the mask heads left at COCO's 80, in a user's config
    on our runtime base."""
    cfg = _mmdet_config(tiny_shapes, base, **{k: 3 for k in bbox_heads})
    _stops(
        cfg, tmp_path,
        rf'^train_dataloader.dataset: The `num_classes` \(80\) in {module} of '
    )


def test_class_names_not_in_the_annotation_file(tiny_shapes, tmp_path):
    classes = ('circle', 'square', 'triangle', 'star', 'hexagon')
    cfg = _cfg(
        tiny_shapes, **{'model.bbox_head.num_classes': 5}, **{
            f'{s}_dataloader.dataset.metainfo.classes': classes
            for s in ('train', 'val', 'test')
        })
    _stops(
        cfg, tmp_path,
        r"^metainfo.classes: 'star', 'hexagon' not among the categories of "
        r".*annotations/instances_train.json \('circle', 'square', "
        r"'triangle'\)")


def test_class_names_in_another_order_than_the_file(tiny_shapes, tmp_path):
    cfg = _cfg(
        tiny_shapes, **{
            'train_dataloader.dataset.metainfo.classes':
            ('square', 'circle', 'triangle')
        })
    _stops(cfg, tmp_path,
           r"another order .* \('circle', 'square', 'triangle'\)")


def test_no_metainfo_means_the_dataset_types_classes(tiny_shapes, tmp_path):
    """mmdet's CocoDataset without ``metainfo.classes`` looks for its 80 COCO
    names in the file."""
    cfg = _cfg(tiny_shapes)
    cfg.train_dataloader.dataset.pop('metainfo')
    _stops(
        cfg, tmp_path,
        r"^metainfo.classes: 'person', 'bicycle', .* not among the categories "
        r"of")


def test_neck_in_channels_other_than_the_backbones(tiny_shapes):
    cfg = _cfg(tiny_shapes,
               **{'model.neck.in_channels': [256, 512, 1024, 2048]})
    with pytest.raises(
            ConfigError,
            match=r'model.neck.in_channels=\[256, 512, 1024, 2048\] but the '
            r'backbone \(AAResNet, depth=18, base_channels=32, '
            r'out_indices=\(0, 1, 2, 3\)\) outputs \[32, 64, 128, '
            r'256\]'):
        build_runner(cfg)


def test_gsa_neck_channels_pass(tiny_shapes):
    check_model_config(
        _cfg(
            tiny_shapes, **{
                'model.backbone':
                dict(
                    _delete_=True,
                    type='GSAResNet',
                    depth=26,
                    base_channels=32,
                    init_cfg=None),
                'model.neck.in_channels': [128, 256, 512, 1024]
            }))


def test_backbone_settings_refused_before_the_runner(tiny_shapes):
    cfg = _cfg(
        tiny_shapes, **{
            'model.backbone.type': 'GSAResNet',
            'model.backbone.depth': 26
        })
    with pytest.raises(
            ConfigError,
            match=r'^model.backbone: GSAResNet: attention key\(s\) '
            r'min_key_dim_per_head'):
        build_runner(cfg)


def test_train_tool_prints_one_line(tiny_shapes, tmp_path):
    options = demo_options(tiny_shapes, **{'model.bbox_head.num_classes': 2})
    out = run_python([
        osp.join(ROOT, 'tools/train.py'), DEMO, '--work-dir', tmp_path,
        '--cfg-options', *[f'{k}={v}' for k, v in options.items()]
    ],
                     cwd=ROOT,
                     env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1].startswith(
        'aa_det: train_dataloader.dataset: The `num_classes` (2)')
