"""The checks run before training and testing: one :class:`ConfigError` line naming the config key, the
file or the value, before the Runner is built and hours are spent (:func:`check_run_config`, called by
:func:`aa_det.engine.build_runner`).

Data, for every dataset of the run's dataloaders, inside wrappers (``RepeatDataset``, ``ConcatDataset``,
...; :func:`leaf_datasets`):

* annotation files and image folders exist; a COCO file looks like one (:func:`check_coco_annotation`,
  a cheap check, not a parse);
* class names of a COCO dataset (``metainfo.classes``, or the dataset type's own classes when the
  config sets none) are in the annotation file's ``categories``, in its order (mmdet would skip them, or
  number the labels in the file's order and name them in the config's); the ``categories`` are read
  without parsing the file: found from its end (where COCO files keep them) in a memory map;
* ``num_classes`` of ``model.bbox_head`` / ``model.roi_head.bbox_head`` / ``model.roi_head.mask_head``
  (each also a list, as in cascades; class-agnostic mask heads aside) is the number of those classes;
* mmpretrain's classification datasets (``CustomDataset``, ``ImageNet``, CIFAR), where mmpretrain would
  fail only when the dataset is built, or mid-run, or never (labels silently wrong)
  (:func:`check_classification_data`): the image folder ``data_root/data_prefix`` and its class folders
  (the labels are their sorted names), the same class folders in every split and as many as the
  dataset's classes and ``model.head.num_classes``, annotation files (``<image> <label>`` lines, labels
  in range, the images they list on disk), a CIFAR folder with ``download=False``. Datasets of other
  types are left alone, without importing mmpretrain.

Model:

* the backbone builds from its settings (a bare assertion of mmdet's is named by its source line), and
  an mmdet ``ResNet`` freezes at most its stages;
* ``model.neck.in_channels`` are the output channels of an mmdet ``ResNet`` backbone (``AAResNet`` and
  ``GSAResNet`` included): ``base_channels * 2**i * expansion`` for ``i`` in ``out_indices``;
* every local ``Pretrained`` checkpoint file exists.

Checkpoints the run loads are checked in :mod:`aa_det.engine.checkpoints`.
"""
import inspect
import json
import mmap
import os
import os.path as osp
import re
import traceback
from typing import Iterator, List, Optional, Sequence, Tuple

from mmdet.datasets import CocoDataset
from mmdet.models.backbones import ResNet
from mmdet.registry import DATASETS, MODELS
from mmengine.config import Config
from mmengine.registry import DefaultScope

from ..datasets.checked_coco import missing_files
from ..models.backbones.attention_resnet import RESNET_DEFAULTS, init_defaults
from ..utils.errors import ConfigError

_CATEGORIES = re.compile(rb'"categories"\s*:\s*')
_COCO_KEYS = {key: re.compile(rb'"%s"\s*:' % key.encode()) for key in ('images', 'annotations', 'categories')}
_LEADING_SPACE = re.compile(rb'\s*')


def check_coco_annotation(ann_file: str, key: str = 'annotation file'):
    """Fail with the file's name (and its config ``key``) unless it looks like a COCO detection json.

    A cheap check, not a parse (mmdet parses the file right after, in every
    rank): the file, memory-mapped, must be one JSON object (``{`` ... ``}``)
    naming the keys ``"images":``, ``"annotations":`` and ``"categories":``
    (searched in C by ``re``, anywhere in the file).
    """
    prefix = '' if key == 'annotation file' else f'{key}: '
    if not osp.isfile(ann_file):
        raise ConfigError(f'{prefix}annotation file not found: {ann_file}')
    try:
        with open(ann_file, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = len(data)
            while end and data[end - 1] in b' \t\r\n':
                end -= 1
            start = _LEADING_SPACE.match(data).end()
            is_object = start < end and data[start] == ord('{') and data[end - 1] == ord('}')
            missing = [key for key, pattern in _COCO_KEYS.items() if not pattern.search(data)]
    except ValueError:  # mmap refuses an empty file
        is_object = False
    except OSError as e:
        raise ConfigError(f'{prefix}annotation file cannot be read: {ann_file} ({e})') from e
    if not is_object:
        raise ConfigError(f'{prefix}annotation file is not a JSON object ({{...}}): {ann_file}')
    if missing:
        raise ConfigError(f'{prefix}annotation file is not COCO format (no {", ".join(missing)}): {ann_file}')


def check_datasets(cfg: Config, splits=('train', 'val', 'test')):
    """Every dataset's annotation file and image folder exist (COCO files are checked too), for each
    dataset inside wrappers (``dataset=``, ``datasets=[...]``: :func:`leaf_datasets`).

    Args:
        splits (Sequence[str]): the dataloaders the run uses (``tools/test.py``: ``('test',)``).
    """
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader or 'dataset' not in loader:
            continue
        for dataset, key in leaf_datasets(loader['dataset'], f'{split}_dataloader.dataset'):
            root = dataset.get('data_root') or ''
            ann = dataset.get('ann_file')
            if ann:
                ann_path = osp.join(root, ann)
                if dataset.get('type') in ('CocoDataset', 'CheckedCocoDataset'):
                    check_coco_annotation(ann_path, f'{key}.ann_file')
                elif not osp.exists(ann_path):
                    raise ConfigError(f'{key}.ann_file not found: {ann_path}')
            prefix = dataset.get('data_prefix')  # mmdet's dict(img=...); mmpretrain's str: its checks
            img_dir = prefix.get('img') if isinstance(prefix, dict) else None
            if img_dir is not None and not osp.isdir(osp.join(root, img_dir)):
                raise ConfigError(f'{key}.data_prefix.img: image folder not found: {osp.join(root, img_dir)}')


def check_pretrained(cfg: Config):
    """Every local ``Pretrained`` checkpoint in the model config exists (URLs and
    ``scheme://`` names are left to mmengine)."""
    def visit(node, path):
        if isinstance(node, dict):
            if node.get('type') == 'Pretrained':
                ckpt = node.get('checkpoint')
                if isinstance(ckpt, str) and '://' not in ckpt and not osp.isfile(ckpt):
                    raise ConfigError(f'{path}.checkpoint not found: {ckpt} (pretrain it with the '
                                      f'classification path, or override it with --cfg-options)')
            for key, value in node.items():
                visit(value, f'{path}.{key}')
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                visit(value, f'{path}[{i}]')

    visit(cfg.get('model', {}), 'model')


def coco_category_names(ann_file: str) -> List[str]:
    """The ``name`` of each entry of a COCO file's ``categories``, in the file's order.

    The last ``"categories":`` key of the memory-mapped file is taken; its list is
    decoded from a window that doubles from 64 KiB until the list ends in it.

    Args:
        ann_file (str): a file that passed :func:`check_coco_annotation`.

    Returns:
        list[str]: the category names.
    """
    with open(ann_file, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        end = len(data)
        while True:
            start = data.rfind(b'"categories"', 0, end)
            if start < 0:
                raise ConfigError(f'annotation file has no "categories" list: {ann_file}')
            key = _CATEGORIES.match(data, start)
            if key:
                break
            end = start
        window = 1 << 16
        while True:
            text = data[key.end():key.end() + window].decode('utf-8', errors='replace')
            try:
                categories = json.JSONDecoder().raw_decode(text)[0]
                break
            except json.JSONDecodeError as e:
                if key.end() + window >= len(data):
                    raise ConfigError(f'annotation file: "categories" is not valid JSON: {ann_file} '
                                      f'({e.msg})') from None
                window *= 2
    if not isinstance(categories, list) or not all(isinstance(c, dict) and 'name' in c for c in categories):
        raise ConfigError(f'annotation file: "categories" is not a list of {{"id", "name"}}: {ann_file}')
    return [c['name'] for c in categories]


def leaf_datasets(dataset: dict, path: str) -> Iterator[Tuple[dict, str]]:
    """The datasets inside wrappers (``dataset=``, ``datasets=[...]``) with their config keys."""
    if 'dataset' in dataset:
        yield from leaf_datasets(dataset['dataset'], f'{path}.dataset')
    elif 'datasets' in dataset:
        for i, inner in enumerate(dataset['datasets']):
            yield from leaf_datasets(inner, f'{path}.datasets[{i}]')
    else:
        yield dataset, path


def _num_classes_keys(model: dict) -> Iterator[Tuple[str, int]]:
    """``(config key, value)`` of every class-aware head's ``num_classes``: ``model.bbox_head``,
    and ``model.roi_head.bbox_head`` / ``mask_head`` (a dict, or a list of them in a cascade);
    a ``class_agnostic`` mask head predicts one mask for every class and is skipped."""
    if isinstance(model.get('bbox_head'), dict) and 'num_classes' in model.bbox_head:
        yield 'model.bbox_head.num_classes', model.bbox_head.num_classes
    roi_head = model.get('roi_head') or {}
    for name in ('bbox_head', 'mask_head'):
        heads = roi_head.get(name)
        for i, head in enumerate(heads if isinstance(heads, (list, tuple)) else [heads]):
            if isinstance(head, dict) and 'num_classes' in head and not head.get('class_agnostic'):
                index = f'[{i}]' if isinstance(heads, (list, tuple)) else ''
                yield f'model.roi_head.{name}{index}.num_classes', head['num_classes']


def check_classes(cfg: Config, splits=('train', 'val', 'test')):
    """The classes of every COCO dataset of ``splits`` are in its annotation file, in the
    file's order, and as many as each head's ``num_classes``."""
    heads = list(_num_classes_keys(cfg.model))
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader or 'dataset' not in loader:
            continue
        for dataset, path in leaf_datasets(loader['dataset'], f'{split}_dataloader.dataset'):
            dataset_type = DATASETS.get(dataset.get('type')) if isinstance(dataset.get('type'), str) \
                else dataset.get('type')
            if not (isinstance(dataset_type, type) and issubclass(dataset_type, CocoDataset)) \
                    or not dataset.get('ann_file'):
                continue
            classes = tuple((dataset.get('metainfo') or {}).get('classes') or ())
            source = f'{path}.metainfo.classes'
            if not classes:
                classes = tuple(dataset_type.METAINFO['classes'])
                source = f'{path}: the {len(classes)} classes of {dataset_type.__name__} (no metainfo.classes)'
            ann_file = osp.join(dataset.get('data_root') or '', dataset['ann_file'])
            names = coco_category_names(ann_file)
            missing = [c for c in classes if c not in names]
            if missing:
                raise ConfigError(f'{source}: {", ".join(map(repr, missing))} not among the categories of '
                                  f'{ann_file} ({", ".join(map(repr, names))})')
            in_file_order = [n for n in names if n in classes]
            if list(classes) != in_file_order:
                raise ConfigError(f'{source}={classes} are in another order than the categories of {ann_file}; '
                                  f'mmdet numbers the labels in the file\'s order: {tuple(in_file_order)}')
            for key, num_classes in heads:
                if num_classes != len(classes):
                    raise ConfigError(f'{key}={num_classes} but {source} gives {len(classes)} classes')


def check_frozen_stages(backbone_cfg: dict):
    """An mmdet ``ResNet`` (or subclass) freezes at most its ``num_stages``: one more stopped
    its build with ``AttributeError: 'ResNet' object has no attribute 'layer5'``."""
    backbone_type = backbone_cfg.get('type')
    if isinstance(backbone_type, str):
        backbone_type = MODELS.get(backbone_type)
    if not (isinstance(backbone_type, type) and issubclass(backbone_type, ResNet)):
        return
    params = inspect.signature(backbone_type.__init__).parameters.values()
    if not any(p.name == 'num_stages' or p.kind is p.VAR_KEYWORD for p in params):
        return  # its stages come from elsewhere (RegNet: from arch)
    settings = {**RESNET_DEFAULTS, **init_defaults(backbone_type), **backbone_cfg}
    frozen, stages = settings['frozen_stages'], settings['num_stages']
    if isinstance(frozen, int) and isinstance(stages, int) and frozen > stages:
        raise ConfigError(f'model.backbone.frozen_stages={frozen} freezes more stages than num_stages={stages} '
                          f'({backbone_cfg.get("type")}; -1: none, 0: the stem, i: the stem and stages 1 to i)')


def check_backbone_and_neck(cfg: Config):
    """The backbone builds from its settings, and the neck's ``in_channels`` are the
    output channels of an mmdet ``ResNet`` (or subclass) backbone."""
    backbone_cfg = cfg.model.get('backbone')
    if not isinstance(backbone_cfg, dict):
        return
    check_frozen_stages(backbone_cfg)
    try:
        backbone = MODELS.build(backbone_cfg)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f'model.backbone: {e.args[0] if e.args else e}') from None
    except AssertionError as e:  # mmdet's own checks (a ResNet's), often without a message: name the check
        frame = traceback.extract_tb(e.__traceback__)[-1]
        if not any(f'{os.sep}{package}{os.sep}' in frame.filename for package in ('mmdet', 'mmcv', 'mmengine')):
            raise  # not a settings check of OpenMMLab's: keep the traceback
        where = f'{osp.basename(frame.filename)}:{frame.lineno}'
        if str(e):  # its message says it; the source line may be the first of several
            raise ConfigError(f'model.backbone ({backbone_cfg.get("type")}): {e} (assert at {where})') from None
        raise ConfigError(f'model.backbone ({backbone_cfg.get("type")}): failed {frame.line or "an assert"!r} '
                          f'at {where}') from None
    neck = cfg.model.get('neck')
    if not isinstance(backbone, ResNet) or not isinstance(neck, dict) \
            or not isinstance(neck.get('in_channels'), (list, tuple)):
        return
    expected = [backbone.base_channels * 2 ** i * backbone.block.expansion for i in backbone.out_indices]
    if list(neck.in_channels) != expected:
        raise ConfigError(f'model.neck.in_channels={list(neck.in_channels)} but the backbone '
                          f'({backbone_cfg.get("type")}, depth={backbone.depth}, '
                          f'base_channels={backbone.base_channels}, out_indices={tuple(backbone.out_indices)}) '
                          f'outputs {expected}')


def check_model_config(cfg: Config, splits=('train', 'val', 'test')):
    """The model against its settings and its data, for the dataloaders of ``splits``, with the
    registries of the config's ``default_scope``."""
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        check_backbone_and_neck(cfg)
        check_classes(cfg, splits)
        check_classification_data(cfg, splits)


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


def check_run_config(cfg: Config, splits: Sequence[str] = ('train', 'val', 'test')):
    """Every check of this module, for the dataloaders of ``splits``."""
    check_datasets(cfg, splits)
    check_pretrained(cfg)
    check_model_config(cfg, splits)
