from .aa_resnet import AABasicBlock, AAResNet
from .gsa_resnet import GSAResNet
from .wide_resnet import WideBasicBlock, WideResNet

__all__ = ['AABasicBlock', 'AAResNet', 'GSAResNet', 'WideBasicBlock', 'WideResNet']
