from .aa_resnet import AAResNet
from .attention_resnet import AttentionResNet
from .gsa_resnet import GSAResNet
from .wide_resnet import WideResNet

__all__ = ['AAResNet', 'AttentionResNet', 'GSAResNet', 'WideResNet']
