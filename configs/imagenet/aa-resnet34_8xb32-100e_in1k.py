# AA-ResNet-34 (AA paper Table 2): kappa = upsilon = 0.25.
_base_ = './resnet50_8xb32-100e_in1k.py'
model = dict(backbone=dict(type='AAResNet', depth=34))
