# GroupNorm everywhere (mmdet configs/scratch recipe): batch-size independent,
# no SyncBN needed. GSA in stages 3-4, as
# retinanet_gsa-r50-scratch_fpn_8xb8-ms-150e_coco.py.
_base_ = './retinanet_r50-scratch_fpn_gn-all_8xb8-ms-150e_coco.py'
model = dict(
    backbone=dict(
        type='GSAResNet', stage_with_attention=(False, False, True, True)))
