# GroupNorm everywhere (mmdet configs/scratch recipe): batch-size independent, no SyncBN needed.
_base_ = './retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py'
norm_cfg = dict(type='GN', num_groups=32, requires_grad=True)
model = dict(backbone=dict(norm_cfg=norm_cfg), neck=dict(norm_cfg=norm_cfg), bbox_head=dict(norm_cfg=norm_cfg))
