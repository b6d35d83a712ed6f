"""The classification path on mmpretrain (its ImageClassifier, datasets,
pipeline and Accuracy with our backbones), its data checks, and the handoff of
its checkpoints to detection."""
import glob
import os.path as osp
import shutil
import subprocess
import sys

import pytest
import torch
from config_checks import check_classification_data
from config_runner import build_runner, load_config
from demo_config import demo_options
from mmengine.config import Config
from mmengine.runner.checkpoint import _load_checkpoint_with_prefix
from synthetic_shapes import generate_shapes_folder
from tool_output import own_stderr
from tool_process import run_python

from aa_det.utils import ConfigError

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs/imagenet/aa-resnet18_1xb32-20e_shapes-cls.py')
DET_PRETRAINED = osp.join(
    ROOT, 'configs/retinanet/'
    'retinanet_aa-r18-shapes-cls-pre_fpn_1xb8-ms-12e_shapes.py')


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('cls'))
    generate_shapes_folder(
        root, num_per_class=8, num_val_per_class=4, image_size=48)
    return root


def _options(root, **extra):
    """``--cfg-options`` pointing the demo at ``root/{train,val}``, without
    DataLoader workers."""
    options = {}
    for split in ('train', 'val', 'test'):
        options.update({
            f'{split}_dataloader.dataset.data_root': root,
            f'{split}_dataloader.num_workers': 0,
            f'{split}_dataloader.persistent_workers': False
        })
    options.update(extra)
    return options


def _mmpretrain_tool(name):
    """A tool mmpretrain's wheel ships (what ``mim train mmpretrain`` /
    ``mim test`` run)."""
    import mmpretrain
    return osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools', name)


def _build_classifier(cfg):
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope(cfg.default_scope)
    return MODELS.build(cfg.model)


def test_configs_are_mmpretrain_configs_with_our_backbones():
    """Package-scope bases resolve, mmpretrain's scope, aa_det imported by the
    config itself."""
    text = Config.fromfile(DEMO, import_custom_modules=False)
    assert (text.default_scope == 'mmpretrain'
            and text.custom_imports.imports == ['aa_det'])
    assert (text.model.type == 'ImageClassifier'
            and text.model.backbone.type == 'mmdet.AAResNet')
    for path in glob.glob(osp.join(ROOT, 'configs/imagenet/*.py')) + glob.glob(
            osp.join(ROOT, 'configs/cifar/*.py')):
        with open(path) as f:
            source = f.read()
        assert ('mmpretrain::_base_/' in source
                or "_base_ = './" in source), path


@pytest.fixture(scope='module')
def mmpretrain_ckpt(shapes, tmp_path_factory):
    """One iteration (8 images) and a validation (4 images) with mmpretrain's
    own tools/train.py, which builds the Runner with ``Runner.from_cfg``; its
    checkpoint."""
    work = tmp_path_factory.mktemp('mmpretrain_train')
    options = _options(
        shapes, **{
            'train_cfg.max_epochs': 1,
            'train_dataloader.batch_size': 8,
            'train_dataloader.dataset.indices': 8,
            'val_dataloader.dataset.indices': 4
        })
    out = subprocess.run([
        sys.executable,
        _mmpretrain_tool('train.py'), DEMO, '--work-dir',
        str(work), '--no-persistent-workers', '--cfg-options',
        *[f'{k}={v}' for k, v in options.items()]
    ],
                         capture_output=True,
                         text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'Epoch(val) [1][1/1]    accuracy/top1: ' in out.stdout + out.stderr
    return work / 'epoch_1.pth'


@pytest.mark.slow
def test_mmpretrain_train_script_checkpoint_initialises_the_detector(
        mmpretrain_ckpt, tiny_shapes):
    """The demo detector's pretrained config, through the tools' build_runner,
    loads every ``backbone.*`` key and value of the checkpoint mmpretrain's
    train script wrote, none missing or unexpected."""
    state = torch.load(mmpretrain_ckpt, map_location='cpu', weights_only=False)
    assert {'backbone',
            'head'} == {k.split('.')[0]
                        for k in state['state_dict']}
    assert state['meta']['dataset_meta']['classes'] == ('circle', 'square',
                                                        'triangle')
    runner = build_runner(
        load_config(
            DET_PRETRAINED,
            cfg_options=demo_options(
                tiny_shapes,
                **{'model.backbone.init_cfg.checkpoint':
                   str(mmpretrain_ckpt)})))
    detector = runner.model
    pretrained = _load_checkpoint_with_prefix(
        'backbone.', str(mmpretrain_ckpt), map_location='cpu')
    detector.init_weights()  # what Runner.train does first
    # no missing / unexpected keys
    assert set(pretrained) == set(detector.backbone.state_dict())
    # after loading (the offset records are made afresh)
    own = detector.backbone.state_dict()
    for key, value in pretrained.items():
        torch.testing.assert_close(own[key], value, msg=key)


def test_our_train_tool_path_trains_and_tests_with_mmpretrains_metric(
        shapes, tmp_path):
    """The same config through aa_det's build_runner (tools/train.py):
    mmpretrain's dataset, pipeline, classifier and Accuracy; its checkpoint is
    the same ``backbone.*`` layout."""
    runner = build_runner(
        load_config(
            DEMO,
            work_dir=str(tmp_path),
            cfg_options=_options(
                shapes, **{
                    'train_cfg.max_epochs': 1,
                    'train_dataloader.batch_size': 8,
                    'train_dataloader.dataset.indices': 8,
                    'test_dataloader.dataset.indices': 4
                })))
    runner.train()
    assert runner.iter == 1 and set(runner.test()) == {'accuracy/top1'}
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    detector_backbone = MODELS.build(
        load_config(DET_PRETRAINED).model).backbone
    ckpt = _load_checkpoint_with_prefix(
        'backbone.', str(tmp_path / 'epoch_1.pth'), map_location='cpu')
    assert set(ckpt) == set(detector_backbone.state_dict())
    # mmpretrain's own API, under torch's safe loading (SafeCheckpointHook)
    from mmpretrain.apis import init_model
    saved = torch.load(
        tmp_path / 'epoch_1.pth', map_location='cpu',
        weights_only=True)['state_dict']
    classifier = init_model(DEMO, str(tmp_path / 'epoch_1.pth'), device='cpu')
    assert all(
        torch.equal(v, saved[k]) for k, v in classifier.state_dict().items()
        if k in saved)


def test_wide_resnet_learns_in_mmpretrains_classifier():
    """The CIFAR config's backbone (ours, narrowed) under mmpretrain's neck,
    head and loss: a few SGD steps on one fixed batch lower its loss."""
    from mmpretrain.structures import DataSample
    cfg = load_config(
        osp.join(ROOT, 'configs/cifar/aa-wrn28-10_8xb32-500e_cifar100.py'),
        cfg_options={
            'model.backbone.depth': 10,
            'model.backbone.widen_factor': 1,
            'model.head.in_channels': 64,
            'model.backbone.attention':
            dict(num_heads=2, min_key_dim_per_head=4)
        })
    torch.manual_seed(0)
    model = _build_classifier(cfg)
    data = dict(
        inputs=[
            torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
            for _ in range(4)
        ],
        data_samples=[DataSample().set_gt_label(i) for i in range(4)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(5):
        batch = model.data_preprocessor(data, training=True)
        loss = model(**batch, mode='loss')['loss']
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


def _cfg(root, **extra):
    return load_config(DEMO, cfg_options=_options(root, **extra))


def test_class_folders_that_differ_between_splits_or_from_num_classes(
        shapes, tmp_path):
    """Labels are the sorted folder names: a class folder missing from val
    shifted every later label there (accuracy silently wrong); ``num_classes``
    below the folders' count failed in the loss mid-epoch. Both are one line
    before the Runner is built."""
    root = tmp_path / 'data'
    shutil.copytree(shapes, root)
    shutil.rmtree(root / 'val' / 'circle')
    with pytest.raises(
            ConfigError,
            match=rf'^val_dataloader.dataset: {root}/val has other class '
            rf'folders than train_dataloader.dataset: {root}/train \(2 '
            rf'vs 3; only in one: circle\): '
            r"the labels are the folders' sorted order$"):
        build_runner(_cfg(str(root)))
    with pytest.raises(
            ConfigError,
            match=rf'^model.head.num_classes=2 but train_dataloader.dataset: '
            rf'{shapes}/train has 3 class folders$'):
        build_runner(_cfg(shapes, **{'model.head.num_classes': 2}))
    # back, but empty: mmpretrain only warns, and it keeps its label
    (root / 'val' / 'circle').mkdir()
    with pytest.raises(
            ConfigError,
            match=rf'^val_dataloader.dataset: class folder has no images .*: '
            rf'{root}/val/circle$'):
        check_classification_data(_cfg(str(root)))
    with pytest.raises(
            ConfigError,
            match=rf'^train_dataloader.dataset: {root}/train has 3 class '
            rf'folders but ImageNet \(its own classes\) names 1000 '
            rf'classes$'):
        check_classification_data(
            _cfg(str(root), **{'train_dataloader.dataset.type': 'ImageNet'}),
            ('train', ))


def test_annotation_file_layout(shapes, tmp_path):
    """mmpretrain's ``<image> <label>`` files: labels against the head, missing
    images counted."""
    ann = tmp_path / 'val.txt'
    ann.write_text('circle/00000.png 0\nsquare/00000.png 1\n')
    val = {
        'val_dataloader.dataset.ann_file': str(ann),
        'val_dataloader.dataset.data_prefix': 'val'
    }
    check_classification_data(_cfg(shapes, **val), ('val', ))
    ann.write_text('circle/00000.png 0\ncircle/x.png 0\nsquare/y.png 1\n')
    with pytest.raises(
            ConfigError,
            match=rf'^val_dataloader.dataset: 2 of 3 images listed in {ann} '
            rf'are missing, first: {shapes}/val/circle/x.png$'):
        check_classification_data(_cfg(shapes, **val), ('val', ))
    ann.write_text('circle/00000.png 7\n')
    with pytest.raises(
            ConfigError,
            match=r'val.txt:1: label 7 is outside \[0, '
            r'model.head.num_classes=3\)$'):
        check_classification_data(_cfg(shapes, **val), ('val', ))
    ann.write_text('circle/00000.png\n')
    with pytest.raises(
            ConfigError,
            match=r'val.txt:1: expected "<image> <label>", got '
            r'\'circle/00000.png\'$'):
        check_classification_data(_cfg(shapes, **val), ('val', ))
    ann.write_text('')
    with pytest.raises(
            ConfigError,
            match=r'ann_file has no "<image> <label>" lines: .*val.txt$'):
        check_classification_data(_cfg(shapes, **val), ('val', ))


def test_imagenet_split_layout_and_cifar_folder(tmp_path):
    """``ImageNet(split='val')`` reads ``data_root/meta/val.txt`` when it
    exists; CIFAR without download names the folder it lacks."""
    from mmpretrain.datasets import ImageNet
    (tmp_path / 'meta').mkdir()
    (tmp_path / 'val').mkdir()
    (tmp_path / 'meta' /
     'val.txt').write_text('ILSVRC2012_val_00000001.JPEG 65\n')
    cfg = load_config(
        osp.join(ROOT, 'configs/imagenet/resnet50_8xb32-100e_in1k.py'),
        cfg_options={'val_dataloader.dataset.data_root': str(tmp_path)})
    with pytest.raises(
            ConfigError,
            match=rf'1 of 1 images listed in {tmp_path}/meta/val.txt are '
            rf'missing, first: '
            rf'{tmp_path}/val/ILSVRC2012_val_00000001.JPEG$'):
        check_classification_data(cfg, ('val', ))
    (tmp_path / 'val' / 'ILSVRC2012_val_00000001.JPEG').write_bytes(b'')
    check_classification_data(cfg, ('val', ))
    # as mmpretrain reads it
    assert len(ImageNet(data_root=str(tmp_path), split='val')) == 1
    cfg = load_config(
        osp.join(ROOT, 'configs/cifar/wrn28-10_8xb128-500e_cifar100.py'),
        cfg_options={
            'train_dataloader.dataset.data_root': str(tmp_path / 'nowhere')
        })
    with pytest.raises(
            ConfigError,
            match=r'^train_dataloader.dataset: no CIFAR100 at '
            r'.*nowhere/cifar-100-python '):
        check_classification_data(cfg, ('train', ))


def test_train_tool_names_a_missing_image_folder_in_one_line(shapes, tmp_path):
    """``tools/train.py`` prints one ``aa_det:`` line (mmpretrain's dataset: a
    traceback)."""
    missing = tmp_path / 'nowhere'
    options = _options(shapes,
                       **{'train_dataloader.dataset.data_root': str(missing)})
    out = run_python([
        osp.join(ROOT, 'tools/train.py'), DEMO, '--work-dir', tmp_path / 'w',
        '--cfg-options', *[f'{k}={v}' for k, v in options.items()]
    ],
                     cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert (own_stderr(out.stderr).strip().splitlines()[-1] == (
        f"aa_det: train_dataloader.dataset: image folder not found: "
        f"{missing}/train (data_root='{missing}', data_prefix='train')"))
    assert 'Traceback' not in out.stderr


@pytest.mark.slow
def test_classification_demo_learns(tmp_path):
    out = subprocess.run([
        sys.executable,
        osp.join(ROOT, 'demo/classification_demo.py'), '--data-root',
        str(tmp_path / 'data'), '--work-dir',
        str(tmp_path / 'work')
    ],
                         capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    top1 = float(
        out.stdout.strip().splitlines()[-1].split('top-1 = ')[1].split('%')[0])
    assert top1 >= 90.0  # chance is 33.3%; 99.2-100% over 8 seeds
    # the checkpoint the shapes-pretrained detection config loads
    detector = osp.join(
        ROOT, 'configs/retinanet/'
        'retinanet_aa-r18-shapes-cls-pre_fpn_1xb8-ms-12e_shapes.py')
    checkpoint = Config.fromfile(
        detector,
        import_custom_modules=False).model.backbone.init_cfg.checkpoint
    assert (tmp_path / 'work' / osp.basename(checkpoint)).is_file(), checkpoint


IMAGENET_CONFIGS = sorted(
    glob.glob(osp.join(ROOT, 'configs/imagenet/*_in1k.py')))


@pytest.mark.parametrize('path', IMAGENET_CONFIGS, ids=osp.basename)
def test_imagenet_configs_build_with_the_papers_schedules(path):
    """Each ImageNet config builds mmpretrain's classifier on our backbone and
    carries its paper's recipe."""
    cfg = load_config(path)
    model = _build_classifier(cfg)
    assert (model.head.fc.out_features == 1000
            and model.head.fc.in_features == model.backbone.feat_dim)
    assert (cfg.train_dataloader.dataset.type == 'ImageNet'
            and cfg.val_evaluator.topk == (1, 5))
    optimizer, schedulers = cfg.optim_wrapper.optimizer, cfg.param_scheduler
    assert (optimizer.type == 'SGD' and optimizer.momentum == 0.9
            and optimizer.weight_decay == 1e-4)
    if '16xb128-90e' in osp.basename(path):  # GSA Sec. 4
        assert (cfg.train_cfg.max_epochs, optimizer.lr,
                cfg.auto_scale_lr.base_batch_size) == (90, 0.1, 2048)
        assert (cfg.train_dataloader.batch_size == 128
                and not optimizer.nesterov)
        assert [s.type for s in schedulers] == ['CosineAnnealingLR'
                                                ] and schedulers[0].T_max == 90
        assert cfg.model.head.loss == dict(
            type='LabelSmoothLoss', label_smooth_val=0.1, loss_weight=1.0)
    else:  # AA appendix A.1
        assert (cfg.train_cfg.max_epochs, optimizer.lr,
                cfg.auto_scale_lr.base_batch_size) == (100, 0.128, 256)
        assert cfg.train_dataloader.batch_size == 32
        assert schedulers[0].end == 5 and schedulers[1].milestones == [
            30, 60, 80, 90
        ]
        assert cfg.model.head.loss.type == 'CrossEntropyLoss'


@pytest.mark.parametrize(
    'name, batch, lr, wd',
    [('wrn28-10_8xb128-500e_cifar100.py', 1024, 0.8, 2e-4),
     ('aa-wrn28-10_8xb32-500e_cifar100.py', 256, 0.2, 5e-4)])
def test_cifar_configs_follow_aa_appendix(name, batch, lr, wd):
    """AA appendix A.1: 500 epochs, lr 0.2 * B / 256 after a 5% linear warm-up,
    then cosine."""
    cfg = load_config(osp.join(ROOT, 'configs/cifar', name))
    model = _build_classifier(cfg)
    assert (model.head.fc.out_features == 100
            and model.backbone.feat_dim == model.head.fc.in_features == 640)
    assert (cfg.train_dataloader.dataset.type == 'CIFAR100'
            and not cfg.train_dataloader.dataset.download)
    assert (cfg.auto_scale_lr.base_batch_size ==
            8 * cfg.train_dataloader.batch_size == batch)
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(0.2 * batch / 256)
    assert (cfg.optim_wrapper.optimizer.lr,
            cfg.optim_wrapper.optimizer.weight_decay) == (lr, wd)
    warmup, cosine = cfg.param_scheduler
    assert (warmup.end == cosine.begin == 25
            and cosine.end == cfg.train_cfg.max_epochs == 500)
