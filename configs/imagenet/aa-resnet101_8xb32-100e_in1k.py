# AA-ResNet-101 (AA paper Table 2): kappa = 2 upsilon = 0.2, 8 heads, relative,
# last three stages.
_base_ = './resnet101_8xb32-100e_in1k.py'
model = dict(backbone=dict(type='mmdet.AAResNet', depth=101))
