_base_ = './retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(backbone=dict(type='AAResNet', depth=101))
