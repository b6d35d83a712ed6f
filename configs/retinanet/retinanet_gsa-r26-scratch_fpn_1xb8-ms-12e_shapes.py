# The demo recipe with a narrow GSA-ResNet-26 (16 base channels, 4 heads):
# RetinaNet + FPN from scratch on the generated shapes dataset
# (tools/make_pictures.sh, benchmarks/backbone_benchmark.py). The demo's
# backbone settings (from scratch, BatchNorm training) carry over; GSA's
# attention replaces AA's. Stages 3-4 attentional, stages 1-2 convolutional
# (GSA Table 5's 'XX' row; docs/design.md, "GSA's stages").
_base_ = './retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py'
model = dict(
    backbone=dict(
        type='GSAResNet',
        depth=26,
        base_channels=16,
        attention=dict(_delete_=True, num_heads=4),
        stage_with_attention=(False, False, True, True)),
    neck=dict(in_channels=[64, 128, 256, 512]))
