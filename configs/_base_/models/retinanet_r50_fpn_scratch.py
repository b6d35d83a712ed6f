# RetinaNet + FPN trained from scratch (AA paper Sec. 4.4), on mmdet's
# RetinaNet base: no pretrained weights, no frozen stages, norm layers train
# (norm_eval=False) in backbone, neck and head. SyncBN is the paper's multi-GPU
# setting; mmengine's Runner turns it into BN when the run has a single process
# (tools/train.py also on a distributed run without GPUs).
#
# The head is mmdet's RetinaSepBNHead: its convs are shared by the five FPN
# levels, as in RetinaHead, but each level has its own BatchNorms, as in the
# TPU RetinaNet code the AA paper trains with. RetinaHead's BatchNorms would be
# shared by the levels too: their running statistics then average five
# different distributions, and a model evaluated with them (eval mode) loses
# much of its mAP (docs/detection.md, "BatchNorm in the head"). The shared
# convs appear in several parameter groups, hence
# optim_wrapper.paramwise_cfg.bypass_duplicate=True in the schedules.
# Float32FocalLoss is mmdet's FocalLoss with bf16 logits cast to float32, which
# mmcv's CUDA kernel needs under bf16 autocast.
_base_ = 'mmdet::_base_/models/retinanet_r50_fpn.py'
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(
        frozen_stages=-1, norm_cfg=norm_cfg, norm_eval=False, init_cfg=None),
    neck=dict(norm_cfg=norm_cfg),
    bbox_head=dict(
        type='RetinaSepBNHead',
        num_ins=5,
        norm_cfg=norm_cfg,
        loss_cls=dict(type='Float32FocalLoss')))
