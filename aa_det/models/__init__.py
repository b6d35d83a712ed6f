from .backbones import *  # noqa: F401,F403  registers AAResNet, GSAResNet, WideResNet in mmdet's MODELS
from .layers import *  # noqa: F401,F403  registers AAConv, GSA as conv layers
from .losses import *  # noqa: F401,F403  registers Float32FocalLoss in mmdet's MODELS
