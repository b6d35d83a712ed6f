# registers AAResNet, GSAResNet, WideResNet in mmdet's MODELS
from .backbones import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403  registers AAConv, GSA as conv layers
# registers Float32FocalLoss in mmdet's MODELS
from .losses import *  # noqa: F401,F403
