"""Checks of a detection or classification config before the Runner is built: the model's
settings, its classes against the data, and its parts against each other.

:func:`check_model_config` (called by :func:`aa_det.engine.build_runner`) raises a
:class:`ConfigError` naming the config key, the value and what fits, for

* a backbone that refuses its settings (built once, without weights; a bare assertion of
  mmdet's is named by its source line), or an mmdet ``ResNet`` that would freeze more stages
  than it has;
* ``model.neck.in_channels`` other than the output channels of an mmdet ``ResNet``
  backbone (``AAResNet`` and ``GSAResNet`` included): ``base_channels * 2**i *
  expansion`` for ``i`` in ``out_indices``;
* class names of a COCO dataset (``metainfo.classes``, or the dataset type's own
  classes when the config sets none) missing from the annotation file's
  ``categories`` or in another order (mmdet would skip them, or number the labels
  in the file's order and name them in the config's);
* ``num_classes`` of ``model.bbox_head`` / ``model.roi_head.bbox_head`` /
  ``model.roi_head.mask_head`` (each also a list, as in cascades; class-agnostic mask
  heads aside) other than the number of those classes;
* mmpretrain classification datasets (``CustomDataset``, ``ImageNet``, CIFAR): splits with different
  class folders (the labels are their sorted order), a number of them other than the classifier's
  ``model.head.num_classes``, annotation files and the images they list
  (:mod:`aa_det.datasets.classification_checks`).

The ``categories`` of an annotation file are read without parsing the file: they
are found from its end (where COCO files keep them) in a memory map, then a bounded
window from there is decoded.
"""
import inspect
import json
import mmap
import os
import os.path as osp
import re
import traceback
from typing import Iterator, List, Tuple

from mmdet.datasets import CocoDataset
from mmdet.models.backbones import ResNet
from mmdet.registry import DATASETS, MODELS
from mmengine.config import Config
from mmengine.registry import DefaultScope

from ..models.backbones.attention_resnet import RESNET_DEFAULTS, init_defaults
from .errors import ConfigError

_CATEGORIES = re.compile(rb'"categories"\s*:\s*')


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


def check_class_folders(cfg: Config, splits=('train', 'val', 'test')):
    """The mmpretrain classification datasets of ``splits``: image folders, class folders against
    each other and ``model.head.num_classes``, annotation files and the images they list
    (:func:`aa_det.datasets.check_classification_data`)."""
    from ..datasets import check_classification_data  # aa_det.datasets imports this package
    check_classification_data(cfg, splits)


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
    """Every check of this module, for the dataloaders of ``splits``, with the registries of
    the config's ``default_scope``."""
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        check_backbone_and_neck(cfg)
        check_classes(cfg, splits)
        check_class_folders(cfg, splits)
