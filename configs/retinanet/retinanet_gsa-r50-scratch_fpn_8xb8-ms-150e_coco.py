# RetinaNet + FPN, GSA-ResNet-50 from scratch: attention in stages 3-4, stages
# 1-2 convolutional (GSA Table 5's 'XX' row: the every-stage model's top-1 at
# 77% of its runtime; the paper's default, every stage, is
# stage_with_attention=(True, True, True, True): docs/design.md, "GSA's
# stages").
_base_ = './retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(
    backbone=dict(
        type='GSAResNet',
        depth=50,
        stage_with_attention=(False, False, True, True)))
