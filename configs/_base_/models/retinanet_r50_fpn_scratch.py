# RetinaNet + FPN trained from scratch (AA paper Sec. 4.4), on mmdet's RetinaNet base: no
# pretrained weights, no frozen stages, norm layers train (norm_eval=False) in backbone, neck
# and head. SyncBN is the paper's multi-GPU setting; tools/train.py turns it into BN when the
# run has a single process or no GPU (SyncBN cannot run there).
_base_ = 'mmdet::_base_/models/retinanet_r50_fpn.py'
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(frozen_stages=-1, norm_cfg=norm_cfg, norm_eval=False, init_cfg=None),
    neck=dict(norm_cfg=norm_cfg),
    bbox_head=dict(norm_cfg=norm_cfg))
