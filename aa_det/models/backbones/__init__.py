from .aa_resnet import AABasicBlock, AAResNet
from .gsa_resnet import GSAResNet

__all__ = ['AABasicBlock', 'AAResNet', 'GSAResNet']
