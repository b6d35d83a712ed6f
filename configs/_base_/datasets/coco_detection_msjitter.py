# mmdet's COCO 2017 detection data with the AA paper's multiscale jitter (Sec.
# 4.4, appendix A.1): resize so the long side is 640 * [0.8, 1.2] = [512, 768],
# crop to 640x640, flip with p = 0.5; tests at the training scale (long side
# 640; README, "Test size", for 1333x800).
_base_ = 'mmdet::_base_/datasets/coco_detection.py'
dataset_type = 'CheckedCocoDataset'
backend_args = None
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='RandomResize',
        scale=(640, 640),
        ratio_range=(0.8, 1.2),
        keep_ratio=True),
    dict(
        type='RandomCrop',
        crop_type='absolute_range',
        crop_size=(640, 640),
        recompute_bbox=True,
        allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(640, 640), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
# CheckedCocoDataset: mmdet's CocoDataset, which checks its files, classes and
# images when built; LenientCocoMetric: mmdet's CocoMetric, which also
# evaluates annotation files without `info`.
train_dataloader = dict(
    batch_size=8,  # x 8 GPUs = 64, the paper's batch
    num_workers=4,
    dataset=dict(type='CheckedCocoDataset', pipeline=train_pipeline))
val_dataloader = dict(
    dataset=dict(type='CheckedCocoDataset', pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='LenientCocoMetric')
test_evaluator = val_evaluator
