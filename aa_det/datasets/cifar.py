"""CIFAR-100 for the AA paper's Wide-ResNet experiments (Table 1), on torchvision's reader."""
import os.path as osp

from mmdet.registry import DATASETS
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.datasets import CIFAR100


@DATASETS.register_module()
class CIFAR100Dataset(Dataset):
    """CIFAR-100 from torchvision's reader, with the standard augmentation (AA appendix A.1):
    4-pixel padded random 32x32 crops and horizontal flips for training, none for evaluation.

    Args:
        data_root (str): folder holding ``cifar-100-python/`` (the python version from
            https://www.cs.toronto.edu/~kriz/cifar.html); nothing is downloaded.
        train (bool): the training split and augmentation. Defaults to True.
    """

    def __init__(self, data_root: str, train: bool = True):
        try:
            self.data = CIFAR100(data_root, train=train, download=False)
        except RuntimeError as e:
            raise FileNotFoundError(f'CIFAR100Dataset: no CIFAR-100 at {osp.join(data_root, "cifar-100-python")} '
                                    f'(unpack cifar-100-python.tar.gz into data_root={data_root}): {e}') from None
        self.transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.PILToTensor()]) \
            if train else T.PILToTensor()
        self.metainfo = dict(classes=tuple(self.data.classes))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        image, label = self.data[index]
        return dict(inputs=self.transform(image), data_samples=label)
