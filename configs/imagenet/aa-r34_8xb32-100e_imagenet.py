# AA-ResNet-34 (AA paper Table 2): kappa = upsilon = 0.25.
_base_ = './resnet50_aa-schedule_8xb32-100e_imagenet.py'
model = dict(backbone=dict(type='AAResNet', depth=34))
