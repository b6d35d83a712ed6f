# AA-ResNet-34 (AA paper Table 2): kappa = upsilon = 0.25; basic blocks, 512
# features into the head.
_base_ = './resnet50_8xb32-100e_in1k.py'
model = dict(
    backbone=dict(type='mmdet.AAResNet', depth=34), head=dict(in_channels=512))
