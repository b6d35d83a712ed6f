# RetinaNet + FPN, AA-ResNet-50 (kappa = 2 upsilon = 0.2, 8 heads, relative),
# from scratch (AA Sec. 4.4).
_base_ = './retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(backbone=dict(type='AAResNet', depth=50))
