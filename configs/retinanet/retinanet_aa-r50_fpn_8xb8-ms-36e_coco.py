# Start from an ImageNet-pretrained backbone written by the classification path
# (tools/train.py configs/imagenet/...); pass its checkpoint with
#   --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/<cls
#   run>/epoch_100.pth
_base_ = './retinanet_aa-r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(
    backbone=dict(
        init_cfg=dict(
            _delete_=True,
            type='Pretrained',
            prefix='backbone.',
            checkpoint='work_dirs/aa-resnet50_8xb32-100e_in1k/epoch_100.pth')))
max_epochs = 36
train_cfg = dict(max_epochs=max_epochs, val_interval=6)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
        end=1000),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[27, 33],
        gamma=0.1)
]
