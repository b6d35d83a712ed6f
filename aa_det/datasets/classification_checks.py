"""Checks of a classification config's data (mmpretrain's datasets) before the Runner is built.

mmpretrain's ``CustomDataset`` (``ImageNet`` is one) reads a folder layout,
``data_root/data_prefix/<class>/*.JPEG``, whose labels are the sorted folder names, or an
annotation file, ``ann_file`` lines ``<image> <label>`` with image paths relative to
``data_root/data_prefix``. ``ImageNet`` with ``split='val'`` reads ``data_root/val/`` and, when
``data_root/meta/val.txt`` exists, that file. What mmpretrain would find only when the dataset is
built (a traceback), or mid-run, or never (labels silently wrong), :func:`check_classification_data`
raises first as a :class:`ConfigError`, which the tools print as one ``aa_det:`` line naming the
config key and the path:

* the image folder ``data_root/data_prefix`` missing; a folder layout with no class folders, or a
  class folder without images (mmpretrain only warns, and the empty class still takes a label);
* class folders that differ between the splits (a class missing from ``val`` shifts every later
  label there), or whose number is not the dataset's classes' (``metainfo.classes``, or the type's
  own: 1000 for ``ImageNet``) or ``model.head.num_classes``;
* an annotation file that is missing or has no lines, a line that is not ``<image> <label>``, a
  label outside ``[0, model.head.num_classes)``, or images it lists that the disk lacks (how many,
  and the first; mmpretrain would stop at the first when it decodes it, in val an epoch in);
* a CIFAR dataset with ``download=False`` whose folder (``data_root/cifar-100-python``) is missing.

Datasets of other types (mmdet's COCO ones, for detection) are left alone, without importing
mmpretrain.
"""
import os
import os.path as osp
from typing import List, Optional, Sequence

from mmengine.config import Config

from ..engine.errors import ConfigError
from ..engine.model_checks import leaf_datasets
from .checked_coco import missing_files

#: the image extensions of mmpretrain's CustomDataset and ImageNet (a config's ``extensions`` wins)
EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif')


def _mmpretrain_class(dataset_type, scope: Optional[str]):
    """The class of a dataset config's ``type`` when it is one of mmpretrain's registry (a name
    under the ``mmpretrain`` default scope, ``'mmpretrain.Name'``, or a class), else None."""
    if isinstance(dataset_type, type):
        return dataset_type
    if not isinstance(dataset_type, str):
        return None
    if '.' in dataset_type:
        scope, dataset_type = dataset_type.split('.', 1)
    if scope != 'mmpretrain':
        return None
    from mmpretrain.registry import DATASETS
    return DATASETS.get(dataset_type)


def _derives_from(cls, name: str) -> bool:
    """``cls`` is mmpretrain's dataset class ``name`` or a subclass of it."""
    return any(c.__name__ == name and c.__module__.startswith('mmpretrain.datasets') for c in cls.__mro__)


def _join(root: str, path: str) -> str:
    return path if not root or osp.isabs(path) else osp.join(root, path)


def _class_folders(folder: str) -> List[str]:
    return sorted(d.name for d in os.scandir(folder) if d.is_dir())


def _read_ann_file(path: str, key: str, with_label: bool, num_classes: Optional[int]) -> List[str]:
    """The image paths of an annotation file, its lines parsed as mmpretrain parses them."""
    if not osp.isfile(path):
        raise ConfigError(f'{key}.ann_file not found: {path}')
    images = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            line = line.rstrip('\n\r')
            if not with_label:
                images.append(line)
                continue
            name, _, label = line.strip().rpartition(' ')
            try:
                label = int(label)
            except ValueError:
                label = None
            if not name or label is None:
                raise ConfigError(f'{key}.ann_file {path}:{line_no}: expected "<image> <label>", got {line!r}')
            if label < 0 or (num_classes is not None and label >= num_classes):
                bound = 'is negative' if num_classes is None else \
                    f'is outside [0, model.head.num_classes={num_classes})'
                raise ConfigError(f'{key}.ann_file {path}:{line_no}: label {label} {bound}')
            images.append(name)
    if not images:
        raise ConfigError(f'{key}.ann_file has no "<image> <label>" lines: {path}')
    return images


def check_classification_data(cfg: Config, splits: Sequence[str] = ('train', 'val', 'test')):
    """Check the mmpretrain classification datasets of the dataloaders of ``splits`` (see the
    module's docstring); a :class:`ConfigError` names the first problem."""
    head = cfg.get('model', {}).get('head')
    num_classes = head.get('num_classes') if isinstance(head, dict) else None
    num_classes = num_classes if isinstance(num_classes, int) else None
    scope = cfg.get('default_scope')
    layouts = []  # (config key, image folder, class folders) of the folder layouts
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader or 'dataset' not in loader:
            continue
        for dataset, key in leaf_datasets(loader['dataset'], f'{split}_dataloader.dataset'):
            cls = _mmpretrain_class(dataset.get('type'), dataset.get('_scope_', scope))
            if cls is None:
                continue
            root = dataset.get('data_root') or ''
            if _derives_from(cls, 'CIFAR10'):
                folder = _join(root, cls.base_folder)
                if not dataset.get('download', True) and not osp.isdir(folder):
                    raise ConfigError(f'{key}: no {cls.__name__} at {folder} (unpack the python version, '
                                      f'{cls.base_folder}.tar.gz, into data_root={root}; download=False)')
                continue
            if not _derives_from(cls, 'CustomDataset'):
                continue
            prefix = dataset.get('data_prefix') or ''
            prefix = prefix.get('img_path', '') if isinstance(prefix, dict) else prefix
            ann_file = dataset.get('ann_file') or ''
            split_name = dataset.get('split')
            if split_name and _derives_from(cls, 'ImageNet'):  # as mmpretrain's ImageNet resolves a split
                prefix = prefix or split_name
                meta = osp.join('meta', f'{split_name}.txt')
                if not ann_file and osp.isfile(_join(root, meta)):
                    ann_file = meta
            folder = _join(root, prefix) if prefix else root
            if not folder or not osp.isdir(folder):
                raise ConfigError(f'{key}: image folder not found: {folder or "(no data_root / data_prefix)"} '
                                  f'(data_root={root!r}, data_prefix={prefix!r})')
            with_label = dataset.get('with_label', True) and split_name != 'test'
            if ann_file:
                ann_path = _join(root, ann_file)
                images = [osp.join(folder, image) for image in
                          _read_ann_file(ann_path, key, with_label, num_classes)]
                missing = missing_files(images)
                if missing:
                    raise ConfigError(f'{key}: {len(missing)} of {len(images)} images listed in {ann_path} are '
                                      f'missing, first: {missing[0]}')
                continue
            if not with_label:
                continue
            classes = _class_folders(folder)
            if not classes:
                raise ConfigError(f'{key}: no class folders in {folder} (the folder layout: '
                                  f'{folder}/<class>/<image>; or give an ann_file)')
            extensions = tuple(e.lower() for e in dataset.get('extensions') or EXTENSIONS)
            for name in classes:
                class_folder = osp.join(folder, name)
                if not any(f.lower().endswith(extensions) for _, _, files in os.walk(class_folder) for f in files):
                    raise ConfigError(f'{key}: class folder has no images ({", ".join(extensions)}): {class_folder}')
            named = (dataset.get('metainfo') or {}).get('classes') or getattr(cls, 'METAINFO', {}).get('classes')
            if isinstance(named, (list, tuple)) and len(named) != len(classes):
                source = f'{key}.metainfo.classes' if (dataset.get('metainfo') or {}).get('classes') \
                    else f'{cls.__name__} (its own classes)'
                raise ConfigError(f'{key}: {folder} has {len(classes)} class folders but {source} names '
                                  f'{len(named)} classes')
            layouts.append((key, folder, classes))
    first_key, first_folder, first = layouts[0] if layouts else (None, None, None)
    for key, folder, classes in layouts[1:]:
        if classes != first:
            differ = sorted(set(classes) ^ set(first))
            raise ConfigError(f'{key}: {folder} has other class folders than {first_key}: {first_folder} '
                              f'({len(classes)} vs {len(first)}; only in one: {", ".join(differ[:5])}'
                              f'{", ..." if len(differ) > 5 else ""}): the labels are the folders\' sorted order')
    if layouts and num_classes is not None and num_classes != len(first):
        raise ConfigError(f'model.head.num_classes={num_classes} but {first_key}: {first_folder} has '
                          f'{len(first)} class folders')
