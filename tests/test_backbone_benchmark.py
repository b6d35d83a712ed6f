"""benchmarks/backbone_benchmark.py: its data (shapes over held-out real
photographs, 10 classes, a 4x range of scales, deterministic) and the detector
config of every backbone it compares."""
import filecmp
import json
import os.path as osp
import sys

import pytest
import torch
from config_runner import load_config
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'benchmarks'))
import backbone_benchmark as bench  # noqa: E402


def test_generated_data_is_coco_with_ten_classes_4x_scales_held_out_photos(
        tmp_path):
    from pycocotools.coco import COCO
    assert not set(bench.TRAIN_PHOTOS) & set(bench.VAL_PHOTOS)
    ann = bench.generate(str(tmp_path / 'a'), 'train', 12, seed=1)
    bench.generate(str(tmp_path / 'b'), 'train', 12, seed=1)
    for name in ['annotations/instances_train.json'
                 ] + [f'train/{i:06d}.png' for i in range(12)]:
        # deterministic
        assert filecmp.cmp(
            tmp_path / 'a' / name, tmp_path / 'b' / name, shallow=False), name
    coco = COCO(ann)
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(
        bench.CLASSES) and len(bench.CLASSES) >= 10
    sides = [max(a['bbox'][2:]) for a in coco.dataset['annotations']]
    assert len(sides) >= 24 and 10 <= min(sides) and max(sides) <= 50
    val = json.load(
        open(
            bench.generate(
                str(tmp_path / 'a'),
                'val_2x',
                2,
                seed=3,
                size=320,
                max_objects=24)))
    assert {(i['width'], i['height']) for i in val['images']} == {(320, 320)}


@pytest.mark.parametrize('backbone', list(bench.BACKBONES))
def test_every_backbone_builds_its_detector_from_its_config(
        backbone, tmp_path):
    """The benchmark's config and overrides give each backbone a RetinaNet with
    10 classes that runs at 160 px; GSA-ResNet-26 is its detection config's
    (stages 3-4 attentional), the all-stages row the paper's default,
    ResNet-26's stages convolutional, same widths."""
    from aa_det.models.layers import GlobalSelfAttention2d
    config, _ = bench.BACKBONES[backbone]
    cfg = load_config(
        config,
        cfg_options=bench.options(str(tmp_path) + '/', 0, 2, backbone, {}))
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model).eval()
    assert model.bbox_head.num_classes == 10
    with torch.no_grad():
        cls_scores, _ = model._forward(torch.randn(1, 3, 160, 160))
    assert cls_scores[0].shape[1] == 10 * 9
    stages = [
        any(
            isinstance(m, GlobalSelfAttention2d)
            for m in getattr(model.backbone, f'layer{i}').modules())
        for i in range(1, 5)
    ]
    assert stages == {
        'GSA-ResNet-26': [False, False, True, True],
        'GSA-ResNet-26, stages 2-4': [False, True, True, True],
        'GSA-ResNet-26, all stages': [True] * 4
    }.get(backbone, [False] * 4)
    if 'ResNet-26' in backbone:
        assert [
            len(getattr(model.backbone, f'layer{i}')) for i in range(1, 5)
        ] == [1, 2, 4, 1]
    assert bench.BACKBONES['GSA-ResNet-26'][0] == osp.join(
        ROOT, 'configs/retinanet/'
        'retinanet_gsa-r26-scratch_fpn_1xb8-ms-12e_shapes.py')


def test_run_names_are_distinct_folder_names():
    names = [bench.run_name(b) for b in bench.BACKBONES]
    assert len(set(names)) == len(names) and bench.run_name(
        'GSA-ResNet-26, all stages') == 'GSA-ResNet-26_all_stages'


def test_results_file_gathers_seeds_over_invocations(tmp_path):
    path = str(tmp_path / 'results.json')
    bench.write_results(path, 24, {},
                        {'GSA-ResNet-26': [{
                            'val': 0.5,
                            'seed': 0
                        }]})
    bench.write_results(path, 24, {}, {
        'GSA-ResNet-26': [{
            'val': 0.6,
            'seed': 1
        }, {
            'val': 0.7,
            'seed': 0
        }],
        'ResNet-18': [{
            'val': 0.4,
            'seed': 2
        }]
    })
    results = json.load(open(path))['results']
    assert results == {
        'GSA-ResNet-26': [{
            'val': 0.7,
            'seed': 0
        }, {
            'val': 0.6,
            'seed': 1
        }],
        'ResNet-18': [{
            'val': 0.4,
            'seed': 2
        }]
    }
    # another schedule: a new file
    bench.write_results(path, 12, {}, {'ResNet-18': [{'val': 0.3, 'seed': 0}]})
    assert json.load(open(path))['results'] == {
        'ResNet-18': [{
            'val': 0.3,
            'seed': 0
        }]
    }
