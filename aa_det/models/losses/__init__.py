from .focal_loss import Float32FocalLoss

__all__ = ['Float32FocalLoss']
