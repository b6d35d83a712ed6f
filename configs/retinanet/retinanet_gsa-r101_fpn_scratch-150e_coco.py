_base_ = './retinanet_r50_fpn_scratch-150e_coco.py'
model = dict(backbone=dict(type='GSAResNet', depth=101))
