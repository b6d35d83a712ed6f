"""The picture tools, run as commands: tools/analysis_tools/plot_curves.py and
demo/vis_detections.py."""
import json
import os
import os.path as osp

import pytest
import torch
from config_runner import load_config
from demo_config import DEMO, ROOT
from PIL import Image
from synthetic_shapes import CLASSES, generate_shapes_coco
from tool_process import run_python

PLOT = osp.join(ROOT, 'tools/analysis_tools/plot_curves.py')
VIS = osp.join(ROOT, 'demo/vis_detections.py')
ENV = dict(os.environ, OMP_NUM_THREADS='1')


def run(*args):
    return run_python(args, env=ENV)


def fails_clearly(out, *names):
    """Exit status != 0 and one line naming ``names``, no traceback."""
    assert out.returncode != 0
    assert 'Traceback' not in out.stderr, out.stderr[-2000:]
    assert all(str(n) in out.stderr for n in names), out.stderr[-2000:]


def write_scalars(run_dir, records):
    (run_dir / 'vis_data').mkdir(parents=True)
    with open(run_dir / 'vis_data' / 'scalars.json', 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in records)
    return run_dir / 'vis_data' / 'scalars.json'


def detection_log(epochs=3, iters_per_epoch=20, interval=5):
    """What mmengine's LocalVisBackend writes for RetinaNet: a line per logged
    training iteration (step = iter) and one per validation (step = epoch),
    COCO's -1 included."""
    records = []
    for epoch in range(1, epochs + 1):
        for i in range(interval, iters_per_epoch + 1, interval):
            it = (epoch - 1) * iters_per_epoch + i
            cls, bbox = 1.2 / (1 + it / 10), 0.9 / (1 + it / 20)
            records.append({
                'base_lr': 0.02,
                'lr': 0.02 * min(1.0, it / 30),
                'data_time': 0.01,
                'grad_norm': 5.0,
                'loss': cls + bbox,
                'loss_cls': cls,
                'loss_bbox': bbox,
                'time': 0.2,
                'epoch': epoch,
                'iter': it,
                'step': it
            })
        m = 0.2 * epoch
        records.append({
            'coco/bbox_mAP': m,
            'coco/bbox_mAP_50': m + 0.2,
            'coco/bbox_mAP_75': m - 0.05,
            'coco/bbox_mAP_s': m - 0.1,
            'coco/bbox_mAP_m': m + 0.05,
            'coco/bbox_mAP_l': -1.0,
            'data_time': 0.003,
            'time': 0.1,
            'step': epoch
        })
    return records


def test_plot_curves_uses_the_newest_run_of_a_work_dir(tmp_path):
    work = tmp_path / 'work'
    write_scalars(work / '20250101_000000', [{
        'lr': 0.1,
        'loss_old': 1.0,
        'epoch': 1,
        'iter': 1,
        'step': 1
    }])
    newest = write_scalars(work / '20260101_120000', detection_log())
    # a later tools/test.py run: no scalars.json
    (work / '20260102_000000').mkdir()
    out_png = tmp_path / 'plots' / 'curves.png'
    out = run(PLOT, work, '--out', out_png)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (str(newest) in out.stdout and 'losses (3)' in out.stdout
            and 'validation: coco (5)' in out.stdout)
    assert out_png.stat().st_size > 20_000
    with Image.open(out_png) as image:
        # 2 x 2 grid: losses, lr, coco (mAP_l is all -1: dropped)
        assert image.size == (1280, 800)


def test_plot_curves_classification_json_and_chosen_keys(tmp_path):
    records = []
    for epoch in range(1, 4):
        records += [{
            'lr': 0.1 / epoch,
            'loss': 1.1 / epoch + i / 100,
            'loss_cls': 1.1 / epoch,
            'epoch': epoch,
            'iter': (epoch - 1) * 3 + i,
            'step': (epoch - 1) * 3 + i
        } for i in (1, 2, 3)]
        records.append({
            'accuracy/top1': 30.0 * epoch,
            'accuracy/top5': 100.0,
            'data_time': 0.004,
            'time': 0.02,
            'step': epoch
        })
    path = write_scalars(tmp_path / 'run', records)
    out_png = tmp_path / 'cls.png'
    out = run(PLOT, path, '--out', out_png, '--keys', 'loss', 'accuracy/*')
    assert out.returncode == 0, out.stderr[-3000:]
    assert ('losses (1)' in out.stdout
            and 'validation: accuracy (2)' in out.stdout
            and 'learning' not in out.stdout)
    with Image.open(out_png) as image:
        assert image.size == (1280, 400) and out_png.stat().st_size > 10_000
    fails_clearly(
        run(PLOT, path, '--out', out_png, '--keys', 'coco/bbox_mAP'),
        'coco/bbox_mAP', path)


def test_plot_curves_without_logs_names_the_dir(tmp_path):
    empty = tmp_path / 'no_logs_here'
    (empty / '20260101_000000').mkdir(parents=True)
    fails_clearly(run(PLOT, empty, '--out', tmp_path / 'x.png'), empty)
    assert not (tmp_path / 'x.png').exists()


@pytest.fixture(scope='module')
def tiny_detector(tmp_path_factory):
    """The demo's shapes data and an untrained demo RetinaNet saved like
    mmengine does (state_dict + meta.dataset_meta), once with and once without
    the class names."""
    root = tmp_path_factory.mktemp('vis')
    data = root / 'shapes'
    generate_shapes_coco(str(data), num_train=4, num_val=2, image_size=64)
    data_root = str(data) + '/'
    options = {
        f'{s}_dataloader.dataset.data_root': data_root
        for s in ('train', 'val', 'test')
    }
    options.update({
        f'{s}_evaluator.ann_file': data_root + 'annotations/instances_val.json'
        for s in ('val', 'test')
    })
    cfg = load_config(DEMO, cfg_options=options)
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    with_meta, without_meta = root / 'with_meta.pth', root / 'without_meta.pth'
    torch.save(
        {
            'state_dict': model.state_dict(),
            'meta': {
                'dataset_meta': {
                    'classes': CLASSES
                }
            }
        }, with_meta)
    torch.save({'state_dict': model.state_dict()}, without_meta)
    return dict(data=data, with_meta=with_meta, without_meta=without_meta)


def test_vis_detections_draws_one_image(tiny_detector, tmp_path):
    image = tiny_detector['data'] / 'val' / '000000.png'
    out = run(
        VIS,
        DEMO,
        tiny_detector['with_meta'],
        image,
        '--out-dir',
        tmp_path / 'vis',
        '--score-thr',
        0,
        # an untrained model's scores are low
        '--cfg-options',
        'model.test_cfg.score_thr=0.0')
    assert out.returncode == 0, out.stderr[-3000:]
    png = tmp_path / 'vis' / '000000.png'
    assert f'{png}: ' in out.stdout
    # boxes were drawn
    assert int(out.stdout.split(f'{png}: ')[1].split()[0]) > 0
    assert 'no class names' not in out.stderr
    with Image.open(png) as drawn, Image.open(image) as original:
        assert drawn.size == original.size
        assert drawn.convert('RGB').tobytes() != original.convert(
            'RGB').tobytes()


def test_vis_detections_folder_and_classes_from_the_config(
        tiny_detector, tmp_path):
    out = run(VIS, DEMO, tiny_detector['without_meta'],
              tiny_detector['data'] / 'val', '--out-dir', tmp_path / 'vis')
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / 'vis')) == ['000000.png', '000001.png']
    assert ('no class names in its meta' in out.stderr and 'circle, square, '
            'triangle' in out.stderr)


def test_vis_detections_bad_paths_are_named(tiny_detector, tmp_path):
    image = tiny_detector['data'] / 'val' / '000000.png'
    missing = tmp_path / 'nowhere' / 'epoch_12.pth'
    fails_clearly(
        run(VIS, DEMO, missing, image), 'checkpoint file not found', missing)
    empty = tmp_path / 'empty_folder'
    empty.mkdir()
    fails_clearly(
        run(VIS, DEMO, tiny_detector['with_meta'], empty), 'no images', empty)


#: the GSA case (24 s) is slow: test_attention_maps.py checks GSA's maps, the
#: AA case this tool's path
@pytest.mark.parametrize(
    'backbone, layer',
    [('AAResNet', 'layer3.0.conv1'),
     pytest.param('GSAResNet', 'layer2.1.conv2', marks=pytest.mark.slow)])
def test_vis_attention_draws_a_grid(tiny_detector, backbone, layer, tmp_path):
    """CONFIG CHECKPOINT, as every tool: the demo detector's checkpoint; a GSA
    classifier's."""
    vis = osp.join(ROOT, 'demo/vis_attention.py')
    if backbone == 'AAResNet':
        config, ckpt = DEMO, tiny_detector['with_meta']
    else:
        config = osp.join(ROOT,
                          'configs/imagenet/gsa-resnet38_16xb128-90e_in1k.py')
        from mmdet.registry import MODELS
        from mmengine.registry import init_default_scope
        init_default_scope('mmdet')
        ckpt = tmp_path / 'gsa.pth'
        torch.save(
            {
                'state_dict': MODELS.build(
                    load_config(config).model).state_dict()
            }, ckpt)
    out_png = tmp_path / 'att.png'
    out = run(vis, config, ckpt, '--layer', layer, '--positions', '10,12',
              '0.5,0.5', '--out', out_png)
    assert out.returncode == 0, out.stderr[-2000:]
    assert Image.open(out_png).size[0] > 100
    fails_clearly(
        run(vis, config, ckpt, '--layer', 'layer9.0', '--out', out_png),
        'layer9.0')
    fails_clearly(
        run(vis, config, tmp_path / 'missing.pth', '--out', out_png),
        'missing.pth')
