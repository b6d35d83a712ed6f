"""Training-loop pieces registered in mmengine's registries."""
from .optim_wrapper import CPUAmpOptimWrapper

__all__ = ['CPUAmpOptimWrapper']
