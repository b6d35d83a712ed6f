# Start from an ImageNet-pretrained GSA-ResNet-50 written by the classification
# path (tools/train.py configs/imagenet/gsa-resnet50_16xb128-90e_in1k.py); pass
# another checkpoint with
#   --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/<cls
#   run>/epoch_90.pth
# The backbone is the classification config's, attention in every stage (the
# paper's GSA-ResNet-50).
_base_ = './retinanet_gsa-r50-scratch_fpn_8xb8-ms-150e_coco.py'
model = dict(
    backbone=dict(
        stage_with_attention=(True, True, True, True),
        init_cfg=dict(
            _delete_=True,
            type='Pretrained',
            prefix='backbone.',
            checkpoint='work_dirs/gsa-resnet50_16xb128-90e_in1k/epoch_90.pth'))
)
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
