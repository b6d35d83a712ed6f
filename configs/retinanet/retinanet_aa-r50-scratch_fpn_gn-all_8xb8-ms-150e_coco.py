# GroupNorm everywhere (mmdet configs/scratch recipe): batch-size independent,
# no SyncBN needed.
_base_ = './retinanet_r50-scratch_fpn_gn-all_8xb8-ms-150e_coco.py'
model = dict(backbone=dict(type='AAResNet'))
