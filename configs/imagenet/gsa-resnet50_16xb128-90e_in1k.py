# GSA-ResNet-50 (GSA paper Table 6): 16 GPUs x 128 = 2048 images, cosine, label
# smoothing 0.1.
_base_ = './resnet50_16xb128-90e_in1k.py'
model = dict(backbone=dict(type='mmdet.GSAResNet', depth=50))
