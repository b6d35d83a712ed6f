"""A config means what it says in every tool: our tools dump and build what
mmengine's plain ``Config.fromfile`` reads (what mmdet's own tools read), and
mmdet's own ``tools/train.py`` and ``tools/test.py`` refuse the bad inputs ours
refuse, before the first training iteration, with the same line: theirs at the
end of a traceback, ours alone."""
import functools
import glob
import os
import os.path as osp
import re

import mmdet
import pytest
import torch
from config_runner import load_config
from data_edits import edit_json
from demo_config import DEMO, ROOT, demo_options
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from test_checkpoints import overwrite_bytes
from tool_output import own_stderr
from tool_process import run_python

from aa_det.utils.compat import TORCH_VERSION

CONFIGS = sorted(
    path for path in glob.glob(
        osp.join(ROOT, 'configs', '**', '*.py'), recursive=True)
    if '_base_' not in path)
MMDET_TOOLS = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools')
ENV = dict(os.environ, OMP_NUM_THREADS='1')
ONE_ITER = {'train_cfg.max_epochs': 1, 'train_dataloader.batch_size': 8}


def _built(cfg):
    """The model a config builds, before a Runner wraps it: its modules' types
    and its state-dict keys."""
    with DefaultScope.overwrite_default_scope(
            cfg.get('default_scope', 'mmdet')):
        torch.manual_seed(0)
        model = MODELS.build(cfg.model)
    return [type(m) for m in model.modules()], list(model.state_dict())


@functools.lru_cache(maxsize=None)
def _plain(path):
    """The file as mmengine reads it (what mmdet's own tools read)."""
    return Config.fromfile(path)


def _dumped(path, tmp_path):
    """The file as mmengine reads it, and what ``tools/train.py`` runs from it
    (the config the Runner dumps)."""
    ours = load_config(path, work_dir=str(tmp_path))
    # what mmengine's Runner.dump_config writes
    ours.dump(str(tmp_path / 'dumped.py'))
    return _plain(path), Config.fromfile(str(tmp_path / 'dumped.py'))


def _config_id(path):
    return osp.relpath(path, osp.join(ROOT, 'configs'))


@pytest.mark.parametrize('path', CONFIGS, ids=_config_id)
def test_our_tools_run_what_the_config_says(path, tmp_path):
    """The same settings, but for what the command line sets (``work_dir``,
    ``launcher``)."""
    plain, dumped = _dumped(path, tmp_path)
    assert dumped.to_dict() == dict(
        plain.to_dict(), work_dir=str(tmp_path), launcher='none')


@pytest.mark.parametrize(
    'path',
    [
        pytest.param(p, marks=[] if 'shapes' in p else pytest.mark.slow)
        for p in CONFIGS
    ],
    # building every full-width model takes a minute and a
    # half on 2 cores
    ids=_config_id)
def test_our_tools_build_the_configs_model(path, tmp_path):
    """The models both build before the Runner wraps them: the same module
    types, the same state-dict keys."""
    plain, dumped = _dumped(path, tmp_path)
    assert _built(dumped) == _built(plain)


def _types(node):
    if isinstance(node, dict):
        return ({node['type']} if isinstance(node.get('type'), str) else
                set()).union(*map(_types, node.values()))
    return set().union(
        *map(_types, node)) if isinstance(node, (list, tuple)) else set()


def test_configs_name_our_types():
    """Where a config needs one of our types, the config names it: the loss
    mmcv's bf16 kernels need, the checked dataset and the lenient metric, and
    the hooks that check a run."""
    for path in CONFIGS:
        types = _types(_plain(path).to_dict())
        assert not types & {'FocalLoss', 'CocoDataset', 'CocoMetric'}, path
        if 'retinanet' in path:
            assert {
                'Float32FocalLoss', 'CheckedCocoDataset', 'LenientCocoMetric',
                'EarlyNumClassCheckHook', 'CheckpointCheckHook',
                'HeadNormCheckHook', 'StopOnNonFiniteLoss'
            } <= types, path


# --- the same refusals from mmdet's own tools and ours -----------------------


def run(tool, *args, options):
    """``tool`` ('ours/train.py', 'mmdet/test.py', ...) on ``args`` with
    ``--cfg-options``."""
    owner, script = tool.split('/')
    path = osp.join(ROOT, 'tools', script) if owner == 'ours' else osp.join(
        MMDET_TOOLS, script)
    cmd = [path, *map(str, args), '--cfg-options'
           ] + [f'{k}={v}' for k, v in options.items()]
    return run_python(cmd, env=ENV, cwd=ROOT)


def assert_refused(out, tool, pattern):
    """Ours: exit 2 and the line alone. mmdet's: a traceback that ends in the
    same line."""
    own = own_stderr(out.stderr)
    if tool.startswith('ours'):
        assert out.returncode == 2 and re.fullmatch(rf'aa_det: {pattern}\n',
                                                    own), out.stderr[-3000:]
    else:
        last = own.rstrip('\n').splitlines()[-1]
        assert out.returncode == 1 and 'Traceback' in own, out.stderr[-3000:]
        assert re.fullmatch(rf'aa_det\.\S*Error: {pattern}',
                            last), out.stderr[-3000:]


TRAIN_TOOLS = ['ours/train.py', 'mmdet/train.py']


@pytest.mark.parametrize('tool', TRAIN_TOOLS)
def test_num_classes_that_do_not_match_the_classes(tool, tiny_shapes,
                                                   tmp_path):
    """A head's num_classes unlike the data's classes stops both tools before
    training (it would train on 2 of the data's 3 classes)."""
    out = run(
        tool,
        DEMO,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(tiny_shapes, **ONE_ITER,
                             **{'model.bbox_head.num_classes': 2}))
    assert_refused(
        out, tool, r'train_dataloader.dataset: The `num_classes` \(2\) in '
        r'RetinaSepBNHead of RetinaNet does not matches the length of '
        r'`classes` 3\) in CheckedCocoDataset; .*')
    assert not glob.glob(str(tmp_path / 'work' / '*.pth'))


@pytest.mark.parametrize('tool', TRAIN_TOOLS)
def test_wrong_image_sizes_in_the_annotation_file(tool, data, tmp_path):
    """Image sizes unlike the annotation file's stop both tools before training
    (the boxes outside the stated size would be left out)."""
    edit_json(
        data / 'annotations' / 'instances_train.json', lambda coco:
        [img.update(width=48, height=48) for img in coco['images']])
    out = run(
        tool,
        DEMO,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(data, **ONE_ITER))
    assert_refused(
        out, tool,
        r'8 of 8 images checked \(all of 8 in \S+instances_train.json\) are '
        r'wrong, first: \S+/train/000000.png is 96x96, the annotation file '
        r'says width 48, height 48 .*')


@pytest.mark.parametrize('tool', TRAIN_TOOLS)
def test_missing_validation_image(tool, data, tmp_path):
    """A missing validation image stops both tools before training, not at the
    first validation."""
    (data / 'val' / '000001.png').unlink()
    out = run(
        tool,
        DEMO,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(data, **ONE_ITER))
    assert_refused(
        out, tool,
        r'1 of 4 images listed in \S+instances_val.json are missing, first: '
        r'\S+/val/000001.png')


@pytest.mark.parametrize('tool', ['ours/test.py', 'mmdet/test.py'])
def test_damaged_checkpoint_is_refused_by_both_test_tools(
        tool, tiny_shapes, tmp_path):
    """A checkpoint whose bytes fail their CRC is refused by both test tools
    (its weights would be wrong)."""
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    good = tmp_path / 'model.pth'
    torch.save(
        {
            'state_dict':
            DET_MODELS.build(Config.fromfile(DEMO).model).state_dict()
        }, good)
    bad, entry = overwrite_bytes(good, str(tmp_path / 'bad.pth'), b'\xff' * 8)
    out = run(
        tool,
        DEMO,
        bad,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(tiny_shapes))
    assert_refused(
        out, tool, rf'checkpoint file is damaged: {re.escape(bad)}: entry '
        rf'{re.escape(entry)} fails its CRC check \(a broken copy or disk\? '
        rf'copy or save it again\)')


def test_our_test_tool_takes_mmdets_show_dir_and_tta(tiny_shapes, tmp_path):
    """``--show-dir`` paints every test image's predictions and ``--tta`` tests
    through mmdet's flip TTA, as in mmdet's own tools/test.py."""
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    ckpt = tmp_path / 'model.pth'
    torch.save(
        {
            'state_dict':
            DET_MODELS.build(Config.fromfile(DEMO).model).state_dict()
        }, ckpt)
    out = run(
        'ours/test.py',
        DEMO,
        ckpt,
        '--work-dir',
        tmp_path / 'work',
        '--show-dir',
        'painted',
        '--tta',
        options=demo_options(tiny_shapes))
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'DetTTAModel' in out.stdout + out.stderr
    assert len(glob.glob(str(tmp_path / 'work' / '*' / 'painted' /
                             '*.png'))) == 4


@pytest.mark.skipif(
    TORCH_VERSION < (2, 6),
    reason="torch.load's safe loading by default needs torch >= 2.6")
@pytest.mark.parametrize('tool', ['ours/test.py', 'mmdet/test.py'])
def test_checkpoint_with_objects_safe_loading_refuses(tool, tiny_shapes,
                                                      tmp_path):
    """A foreign checkpoint that pickles a Python object: refused in one line
    naming the global, with nothing allowed for it."""
    import argparse

    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    ckpt = tmp_path / 'foreign.pth'
    torch.save(
        {
            'state_dict':
            DET_MODELS.build(Config.fromfile(DEMO).model).state_dict(),
            'meta': {
                'args': argparse.Namespace(lr=0.1)
            }
        }, ckpt)
    out = run(
        tool,
        DEMO,
        ckpt,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(tiny_shapes))
    assert_refused(
        out, tool,
        rf'checkpoint file cannot be loaded: {re.escape(str(ckpt))}: it holds '
        rf'Python objects that safe loading refuses \(GLOBAL '
        rf'argparse.Namespace\); if you trust the file, load it once and save '
        rf'only its state_dict')


@pytest.mark.parametrize('tool', TRAIN_TOOLS)
def test_frozen_backbone_weights_that_nothing_loaded(tool, tiny_shapes,
                                                     tmp_path):
    """mmdet ResNet's ``frozen_stages=1`` and ``norm_eval=True`` in our config
    from scratch: the configs' ``CheckpointCheckHook`` refuses them before the
    first iteration (the backbone itself only warns)."""
    out = run(
        tool,
        DEMO,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(
            tiny_shapes, **ONE_ITER, **{
                'model.backbone.frozen_stages': 1,
                'model.backbone.norm_eval': True
            }))
    assert_refused(
        out, tool,
        r'model.backbone \(AAResNet\): frozen_stages=1, norm_eval=True freeze '
        r'\d+ tensors \(0.\d\dM parameters\) at their random initialisation: '
        r'no init_cfg Pretrained, load_from or resume loaded them \(first: '
        r'conv1.weight; .*')
    assert not glob.glob(str(tmp_path / 'work' / '*.pth'))


@pytest.mark.skipif(
    TORCH_VERSION < (2, 6),
    reason="torch.load's safe loading by default needs torch >= 2.6")
def test_runner_checkpoint_in_a_config_without_our_hooks_names_the_converter(
        tiny_shapes, tmp_path):
    """A checkpoint mmengine's Runner wrote without ``SafeCheckpointHook`` (its
    MessageHub's ``HistoryBuffer``), tested with a config that names none of
    our checkpoint hooks: our tool's one line names the file and the converter,
    where torch's error is a page of advice."""
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.logging import HistoryBuffer
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    ckpt = tmp_path / 'runner.pth'
    torch.save(
        {
            'state_dict':
            DET_MODELS.build(Config.fromfile(DEMO).model).state_dict(),
            'message_hub': {
                'log_scalars': {
                    'loss': HistoryBuffer([0.5], [1])
                }
            }
        }, ckpt)
    # the demo with mmdet's default_hooks
    config = tmp_path / 'without_our_hooks.py'
    config.write_text(
        f"_base_ = [{DEMO!r}]\ndefault_hooks = dict(_delete_=True, "
        f"timer=dict(type='IterTimerHook'), logger=dict(type='LoggerHook'), "
        f"param_scheduler=dict(type='ParamSchedulerHook'), "
        f"checkpoint=dict(type='CheckpointHook', interval=1), "
        f"sampler_seed=dict(type='DistSamplerSeedHook'), "
        f"visualization=dict(type='DetVisualizationHook'))\n")
    out = run(
        'ours/test.py',
        config,
        ckpt,
        '--work-dir',
        tmp_path / 'work',
        options=demo_options(tiny_shapes))
    assert 'CheckpointCheckHook' not in out.stdout + out.stderr, out.stdout[
        -3000:]
    assert_refused(
        out, 'ours/test.py',
        rf'checkpoint file cannot be loaded: {re.escape(str(ckpt))}: it holds '
        rf'Python objects that safe loading refuses \(GLOBAL '
        rf'mmengine.logging.history_buffer.HistoryBuffer\); if you trust the '
        rf'file, convert it: python tools/convert_checkpoint.py OLD NEW')
