"""The ImageNet classification path and the handoff of its checkpoints to detection."""
import glob
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.runner.checkpoint import _load_checkpoint_with_prefix

from aa_det.datasets import ImageNetFolder, generate_shapes_folder
from aa_det.engine import ConfigError, build_runner, load_config
from aa_det.evaluation import TopKAccuracy

from tool_output import own_stderr

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs/imagenet/aa-resnet18_1xb32-10e_shapes-cls.py')
DET_PRETRAINED = osp.join(ROOT, 'configs/retinanet/retinanet_aa-r18-shapes-cls-pre_fpn_1xb8-ms-12e_shapes.py')


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    return generate_shapes_folder(str(tmp_path_factory.mktemp('cls')), num_per_class=8,
                                  num_val_per_class=4, image_size=48)


def _options(paths, **extra):
    options = {'train_dataloader.dataset.data_root': paths['train'],
               'val_dataloader.dataset.data_root': paths['val'],
               'test_dataloader.dataset.data_root': paths['val']}
    for split in ('train', 'val', 'test'):
        options.update({f'{split}_dataloader.num_workers': 0, f'{split}_dataloader.persistent_workers': False})
    options.update(extra)
    return options


def test_classifier_checkpoint_loads_into_detector_backbone(shapes, tmp_path):
    """Pretrain (1 epoch, real Runner), then the demo detector's pretrained config loads it whole."""
    runner = build_runner(load_config(DEMO, work_dir=str(tmp_path), cfg_options=_options(
        shapes, **{'train_cfg.max_epochs': 1, 'train_dataloader.batch_size': 8})))
    runner.train()
    ckpt = str(tmp_path / 'epoch_1.pth')
    assert 'accuracy/top1' in runner.test()

    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    det_cfg = load_config(DET_PRETRAINED, cfg_options={'model.backbone.init_cfg.checkpoint': ckpt})
    init_default_scope('mmdet')
    detector = MODELS.build(det_cfg.model)
    pretrained = _load_checkpoint_with_prefix('backbone.', ckpt, map_location='cpu')
    own = detector.backbone.state_dict()
    assert set(pretrained) == set(own), (set(pretrained) ^ set(own))  # no missing / unexpected keys
    detector.init_weights()
    own = detector.backbone.state_dict()  # after loading (the offset records are made afresh)
    for key, value in pretrained.items():
        torch.testing.assert_close(own[key], value, msg=key)


def test_topk_accuracy():
    metric = TopKAccuracy(topk=(1, 2))
    scores = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.2, 0.3, 0.5]])
    metric.process(None, [dict(pred_score=s, gt_label=torch.tensor(l)) for s, l in zip(scores, [1, 2, 0])])
    assert metric.compute_metrics(metric.results) == {'top1': pytest.approx(100 / 3), 'top2': pytest.approx(200 / 3)}


def test_dataset_layouts_and_errors(shapes, tmp_path):
    ds = ImageNetFolder(shapes['train'], crop_size=32)
    assert ds.classes == ['circle', 'square', 'triangle'] and len(ds) == 24
    item = ds[0]
    assert item['inputs'].shape == (3, 32, 32) and item['inputs'].dtype == torch.uint8
    # flat layout with a label file
    (tmp_path / 'labels.txt').write_text(f'{shapes["val"]}/circle/00000.png 0\n{shapes["val"]}/square/00000.png 1\n')
    flat = ImageNetFolder('/', ann_file=str(tmp_path / 'labels.txt'), num_classes=3, train=False, crop_size=32,
                          resize_size=32)
    assert [label for _, label in flat.samples] == [0, 1]
    (tmp_path / 'bad_labels.txt').write_text('a.png 7\n')
    with pytest.raises(ValueError, match=r'bad_labels.txt:1: label 7 outside \[0, 3\)'):
        ImageNetFolder(str(tmp_path), ann_file='bad_labels.txt', num_classes=3)
    empty = tmp_path / 'empty_root'
    (empty / 'cat').mkdir(parents=True)
    with pytest.raises(ConfigError, match='class folder has no images: .*cat'):
        ImageNetFolder(str(empty))
    (tmp_path / 'no_lines.txt').write_text('\n')
    with pytest.raises(ConfigError, match=r'ann_file has no "<image> <label>" lines: .*no_lines.txt$'):
        ImageNetFolder(str(tmp_path), ann_file='no_lines.txt')
    # a listed image the disk lacks: found when the dataset is built, not when the first
    # validation decodes it an epoch in
    (tmp_path / 'one_missing.txt').write_text(f'{shapes["val"]}/circle/00000.png 0\n{shapes["val"]}/circle/x.png 0\n')
    with pytest.raises(ConfigError, match=r'1 of 2 images listed in .*one_missing.txt are missing, first: .*circle/x.png$'):
        ImageNetFolder('/', ann_file=str(tmp_path / 'one_missing.txt'))
    corrupt = tmp_path / 'corrupt' / 'dog'
    corrupt.mkdir(parents=True)
    (corrupt / 'x.png').write_bytes(b'not an image')
    with pytest.raises(OSError, match='cannot decode image .*x.png'):
        ImageNetFolder(str(tmp_path / 'corrupt'))[0]


def test_class_folders_that_differ_between_splits_or_from_num_classes(shapes, tmp_path):
    """The folder layout labels classes by their sorted folder names: a class folder missing from
    val shifted every later label there (accuracy silently wrong); ``num_classes`` below the
    folders' count failed in the loss mid-epoch. Both are one line before the Runner is built."""
    import shutil
    val = tmp_path / 'val'
    shutil.copytree(shapes['val'], val)
    shutil.rmtree(val / 'circle')
    cfg = load_config(DEMO, work_dir=str(tmp_path), cfg_options=_options(shapes, **{
        'val_dataloader.dataset.data_root': str(val)}))
    with pytest.raises(ConfigError, match=rf'^val_dataloader.dataset.data_root={val} has other class folders than '
                                          rf'train_dataloader.dataset.data_root={shapes["train"]} \(2 vs 3; only in '
                                          r"one: circle\): the labels are the folders' sorted order$"):
        build_runner(cfg)
    cfg = load_config(DEMO, work_dir=str(tmp_path), cfg_options=_options(shapes, **{'model.num_classes': 2}))
    with pytest.raises(ConfigError, match=rf'^model.num_classes=2 but train_dataloader.dataset.data_root='
                                          rf'{shapes["train"]} has 3 class folders$'):
        build_runner(cfg)


def test_class_folders_of_an_imagenet_folder_subclass_are_checked(shapes, tmp_path):
    """A user's registered subclass of ``ImageNetFolder`` labels its folders the same way."""
    import shutil
    from mmdet.registry import DATASETS

    @DATASETS.register_module(force=True)
    class SubclassedFolder(ImageNetFolder):
        pass

    val = tmp_path / 'val'
    shutil.copytree(shapes['val'], val)
    shutil.rmtree(val / 'square')
    cfg = load_config(DEMO, work_dir=str(tmp_path), cfg_options=_options(shapes, **{
        'val_dataloader.dataset.data_root': str(val), 'val_dataloader.dataset.type': 'SubclassedFolder'}))
    with pytest.raises(ConfigError, match=r'^val_dataloader.dataset.data_root=.* \(2 vs 3; only in one: square\)'):
        build_runner(cfg)


def test_train_tool_names_a_missing_data_root_in_one_line(shapes, tmp_path):
    """The dataset's errors are ConfigErrors: ``tools/train.py`` prints one ``aa_det:`` line
    (it printed a traceback)."""
    missing = tmp_path / 'nowhere'
    options = _options(shapes, **{'train_dataloader.dataset.data_root': str(missing)})
    out = subprocess.run([sys.executable, osp.join(ROOT, 'tools/train.py'), DEMO, '--work-dir', str(tmp_path / 'w'),
                          '--cfg-options', *[f'{k}={v}' for k, v in options.items()]],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert own_stderr(out.stderr).strip().splitlines()[-1] == f'aa_det: ImageNetFolder: data_root is not a folder: {missing}'
    assert 'Traceback' not in out.stderr


@pytest.mark.slow
def test_classification_demo_learns(tmp_path):
    out = subprocess.run([sys.executable, osp.join(ROOT, 'demo/classification_demo.py'),
                          '--data-root', str(tmp_path / 'data'), '--work-dir', str(tmp_path / 'work')],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    top1 = float(out.stdout.strip().splitlines()[-1].split('top-1 = ')[1].split('%')[0])
    assert top1 >= 60.0  # chance is 33.3%


IMAGENET_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs/imagenet/*_in1k.py')))


@pytest.mark.parametrize('path', IMAGENET_CONFIGS, ids=osp.basename)
def test_imagenet_configs_build_with_the_papers_schedules(path):
    """Each ImageNet config builds its classifier and carries its paper's recipe."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    cfg = load_config(path)
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    assert model.head.out_features == 1000
    optimizer, schedulers = cfg.optim_wrapper.optimizer, cfg.param_scheduler
    assert optimizer.type == 'SGD' and optimizer.momentum == 0.9 and optimizer.weight_decay == 1e-4
    if '16xb128-90e' in osp.basename(path):  # GSA Sec. 4
        assert (cfg.train_cfg.max_epochs, optimizer.lr, cfg.auto_scale_lr.base_batch_size) == (90, 0.1, 2048)
        assert schedulers[0].type == 'CosineAnnealingLR' and cfg.model.label_smoothing == 0.1
    else:  # AA appendix A.1
        assert (cfg.train_cfg.max_epochs, optimizer.lr, cfg.auto_scale_lr.base_batch_size) == (100, 0.128, 256)
        assert schedulers[0].end == 5 and schedulers[1].milestones == [30, 60, 80, 90]


def test_classifier_predicts_without_labels_and_rejects_a_headless_trunk():
    from aa_det.models.classifiers import ImageClassifier
    model = ImageClassifier(dict(type='ResNet', depth=18), num_classes=5).eval()
    preds = model(torch.rand(2, 3, 64, 64), mode='predict')
    assert len(preds) == 2 and preds[0]['pred_score'].shape == (5,)
    with pytest.raises(ValueError, match=r'out_indices=\(1,\)'):
        ImageClassifier(dict(type='ResNet', depth=18, out_indices=(1,)))


@pytest.mark.parametrize('name, batch, lr, wd', [('wrn28-10_8xb128-500e_cifar100.py', 1024, 0.8, 2e-4),
                                                 ('aa-wrn28-10_8xb32-500e_cifar100.py', 256, 0.2, 5e-4)])
def test_cifar_configs_follow_aa_appendix(name, batch, lr, wd):
    """AA appendix A.1: 500 epochs, lr 0.2 * B / 256 after a 5% linear warm-up, then cosine."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    cfg = load_config(osp.join(ROOT, 'configs/cifar', name))
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    assert model.head.out_features == 100 and model.backbone.feat_dim == 640
    assert cfg.auto_scale_lr.base_batch_size == 8 * cfg.train_dataloader.batch_size == batch
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(0.2 * batch / 256)
    assert (cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay) == (lr, wd)
    warmup, cosine = cfg.param_scheduler
    assert warmup.end == cosine.begin == 25 and cosine.end == cfg.train_cfg.max_epochs == 500


def test_cifar_dataset_missing_names_the_folder(tmp_path):
    from aa_det.datasets import CIFAR100Dataset
    with pytest.raises(FileNotFoundError, match='no CIFAR-100 at .*nowhere/cifar-100-python'):
        CIFAR100Dataset(str(tmp_path / 'nowhere'))


def test_wide_resnet_classifier_trains_with_the_runner(shapes, tmp_path):
    """The CIFAR backbone through ImageClassifier and mmengine's Runner (shapes data at 32x32)."""
    backbone = dict(_delete_=True, type='WideResNet', depth=10, widen_factor=1, num_stages=3,
                    attention=dict(num_heads=2, min_key_dim_per_head=4))
    runner = build_runner(load_config(DEMO, work_dir=str(tmp_path), cfg_options=_options(shapes, **{
        'model.backbone': backbone, 'train_cfg.max_epochs': 1, 'train_dataloader.batch_size': 8,
        'train_dataloader.dataset.crop_size': 32, 'val_dataloader.dataset.crop_size': 32,
        'test_dataloader.dataset.crop_size': 32})))
    runner.train()
    assert runner.iter == 3 and 'accuracy/top1' in runner.test()
