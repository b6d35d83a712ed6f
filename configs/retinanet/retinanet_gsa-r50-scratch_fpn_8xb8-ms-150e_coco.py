# RetinaNet + FPN, GSA-ResNet-50 (all four stages), from scratch.
_base_ = './retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(backbone=dict(type='GSAResNet', depth=50))
