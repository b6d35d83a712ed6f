# RetinaNet + FPN, GSA-ResNet-50 from scratch: attention in stages 2-4, stage 1 convolutional (GSA Table 5's
# best row; the paper's default, every stage, is stage_with_attention=(True, True, True, True):
# docs/design.md, "GSA's stages").
_base_ = './retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(backbone=dict(type='GSAResNet', depth=50, stage_with_attention=(False, True, True, True)))
