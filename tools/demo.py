"""The main job on the embedded default (README: `bash tools/demo.sh`).

Smoke run: builds RetinaNet + FPN with an AA-ResNet-50 and a GSA-ResNet-50 backbone
from configs/_base_/models/retinanet_r50_fpn_scratch.py through mmdet's registry,
runs one forward pass on a random 1x3x320x480 image and prints the output shapes
of each FPN level for the classification and box branches.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _env_check import require_env  # noqa: E402

require_env()

import torch  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402

import aa_det  # noqa: E402,F401

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def main():
    init_default_scope('mmdet')
    cfg = Config.fromfile(osp.join(ROOT, 'configs/_base_/models/retinanet_r50_fpn_scratch.py'))
    torch.manual_seed(0)
    image = torch.rand(1, 3, 320, 480)
    for backbone in (dict(type='AAResNet', depth=50), dict(type='GSAResNet', depth=50)):
        model_cfg = cfg.model.copy()
        model_cfg.backbone = dict(cfg.model.backbone, **backbone, norm_cfg=dict(type='BN'))
        for part in ('neck', 'bbox_head'):
            model_cfg[part] = dict(cfg.model[part], norm_cfg=dict(type='BN'))
        model = MODELS.build(model_cfg).eval()
        with torch.no_grad():
            cls_scores, bbox_preds = model(image, mode='tensor')
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f'RetinaNet + {backbone["type"]}-{backbone["depth"]} ({params:.1f}M params), input {tuple(image.shape)}')
        for level, (c, b) in enumerate(zip(cls_scores, bbox_preds)):
            print(f'  P{level + 3}: cls {tuple(c.shape)}  bbox {tuple(b.shape)}')


if __name__ == '__main__':
    main()
