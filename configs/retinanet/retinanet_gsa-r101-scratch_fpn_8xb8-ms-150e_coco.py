# GSA in stages 2-4, as retinanet_gsa-r50-scratch_fpn_8xb8-ms-150e_coco.py.
_base_ = './retinanet_gsa-r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(backbone=dict(depth=101))
