"""ImageNet-style classification data on torchvision's datasets and transforms.

Layouts: folders (``root/<class>/*.JPEG``) or a flat folder with a label file
(``ann_file`` lines ``relative/path.JPEG <class index>``, the common ImageNet val
layout). Images are decoded in DataLoader workers; transforms are Inception-style
(random-resized crop + flip) for training, resize + centre crop for evaluation.
A layout that cannot be read (no folder, an empty class folder, a bad label line, an
image the label file lists but the disk lacks) is a :class:`ConfigError` when the
dataset is built, which the tools print as one line before training starts.
"""
import os
import os.path as osp
from typing import Optional, Sequence

from mmdet.registry import DATASETS
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.datasets.folder import IMG_EXTENSIONS, default_loader

from ..engine.errors import ConfigError
from .checked_coco import missing_files


def build_transform(train: bool, crop_size: int = 224, resize_size: int = 256,
                    crop_scale: Sequence[float] = (0.08, 1.0)):
    """Inception-style augmentation (train) or resize + centre crop (eval); uint8 CHW out."""
    if train:
        return T.Compose([T.RandomResizedCrop(crop_size, scale=tuple(crop_scale)), T.RandomHorizontalFlip(),
                          T.PILToTensor()])
    return T.Compose([T.Resize(resize_size), T.CenterCrop(crop_size), T.PILToTensor()])


@DATASETS.register_module()
class ImageNetFolder(Dataset):
    """Classification dataset over a folder layout or a flat folder + label file.

    Args:
        data_root (str): dataset folder (``train/`` or ``val/`` of ImageNet).
        ann_file (str, optional): label file for the flat layout, relative to
            ``data_root`` or absolute. Without it the folder layout is used and
            classes are the sorted sub-folder names.
        num_classes (int, optional): with ``ann_file``, labels must be below it.
        train (bool): training transforms. Defaults to True.
        crop_size (int): output size. Defaults to 224.
        resize_size (int): eval resize before the centre crop. Defaults to 256.
        crop_scale (Sequence[float]): area range of the random-resized crop.
            Defaults to (0.08, 1.0) (Inception).
    """

    def __init__(self, data_root: str, ann_file: Optional[str] = None, num_classes: Optional[int] = None,
                 train: bool = True, crop_size: int = 224, resize_size: int = 256,
                 crop_scale: Sequence[float] = (0.08, 1.0)):
        if not osp.isdir(data_root):
            raise ConfigError(f'ImageNetFolder: data_root is not a folder: {data_root}')
        self.transform = build_transform(train, crop_size, resize_size, crop_scale)
        if ann_file is None:
            classes = sorted(d.name for d in os.scandir(data_root) if d.is_dir())
            if not classes:
                raise ConfigError(f'ImageNetFolder: no class folders in {data_root}')
            self.classes, self.samples = classes, []
            for label, name in enumerate(classes):
                folder = osp.join(data_root, name)
                files = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMG_EXTENSIONS))
                if not files:
                    raise ConfigError(f'ImageNetFolder: class folder has no images: {folder}')
                self.samples += [(osp.join(folder, f), label) for f in files]
        else:
            path = ann_file if osp.isabs(ann_file) else osp.join(data_root, ann_file)
            if not osp.isfile(path):
                raise ConfigError(f'ImageNetFolder: ann_file not found: {path}')
            self.samples = []
            with open(path) as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        name, label = line.split()
                        label = int(label)
                    except ValueError:
                        raise ConfigError(f'ImageNetFolder: {path}:{line_no}: expected "<image> <label>", '
                                          f'got {line.strip()!r}') from None
                    if label < 0 or (num_classes is not None and label >= num_classes):
                        bound = 'is negative' if num_classes is None else f'outside [0, {num_classes})'
                        raise ConfigError(f'ImageNetFolder: {path}:{line_no}: label {label} {bound}')
                    self.samples.append((osp.join(data_root, name), label))
            if not self.samples:
                raise ConfigError(f'ImageNetFolder: ann_file has no "<image> <label>" lines: {path}')
            missing = missing_files([image for image, _ in self.samples])
            if missing:  # else decoding it would stop the run (in val: at the first validation)
                raise ConfigError(f'ImageNetFolder: {len(missing)} of {len(self.samples)} images listed in '
                                  f'{path} are missing, first: {missing[0]}')
            n = num_classes or 1 + max(label for _, label in self.samples)
            self.classes = [str(i) for i in range(n)]
        self.metainfo = dict(classes=tuple(self.classes))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        try:
            image = default_loader(path)
        except (OSError, Image.DecompressionBombError) as e:
            raise OSError(f'ImageNetFolder: cannot decode image {path}: {e}') from e
        return dict(inputs=self.transform(image), data_samples=label)
