# The demo recipe with a narrow GSA-ResNet-26 (16 base channels, 4 heads): RetinaNet + FPN from
# scratch on the generated shapes dataset (tools/make_pictures.sh, benchmarks/position_extrapolation.py).
_base_ = './retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='GSAResNet',
        depth=26,
        base_channels=16,
        frozen_stages=-1,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        norm_eval=False,
        attention=dict(num_heads=4),
        init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]))
