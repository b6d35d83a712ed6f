# RetinaNet + FPN, ResNet-50, from scratch on COCO (AA paper Table 5 baseline
# setting).
_base_ = [
    '../_base_/models/retinanet_r50_fpn_scratch.py',
    '../_base_/datasets/coco_detection_msjitter.py',
    '../_base_/schedules/scratch_150e.py',
    '../_base_/default_runtime.py',
]
