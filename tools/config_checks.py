"""The checks tools/train.py and tools/test.py run before the model is built,
each failure one :class:`ConfigError` line naming the config key, the file or
the value (:func:`check_run_config`, called by ``config_runner.build_runner``).
Every other check runs from what the config names (the dataset, the metric, the
hooks), under mmdet's own tools as under ours: docs/detection.md lists them.
These are what a config cannot say: a check before the build, where mmdet's
tools stop later or in a bare assertion.

* a config that names a type ``import aa_det`` registers imports aa_det
  (``custom_imports``), as mmdet's tools and ``init_detector`` need: our
  tools import aa_det for their own code, and without this check such a
  config would train here and fail there (:func:`check_custom_imports`);

* the backbone builds from its settings (a bare assertion of mmdet's is named
  by its source line), and an mmdet ``ResNet`` freezes at most its stages;
* ``model.neck.in_channels`` are the output channels of an mmdet ``ResNet``
  backbone (``AAResNet`` and ``GSAResNet`` included):
  ``base_channels * 2**i * expansion`` for ``i`` in ``out_indices``;
* mmpretrain's classification datasets (``CustomDataset``, ``ImageNet``,
  CIFAR), for every dataset of the run's dataloaders inside wrappers
  (:func:`leaf_datasets`), where mmpretrain would fail only when the dataset is
  built, or mid-run, or never (labels silently wrong)
  (:func:`check_classification_data`): the image folder
  ``data_root/data_prefix`` and its class folders (the labels are their sorted
  names), the same class folders in every split and as many as the dataset's
  classes and ``model.head.num_classes``, annotation files (``<image> <label>``
  lines, labels in range, the images they list on disk), a CIFAR folder with
  ``download=False``. Datasets of other types are left alone, without importing
  mmpretrain.
"""
import inspect
import os
import os.path as osp
import traceback
from typing import Iterator, List, Optional, Sequence, Tuple

from mmdet.models.backbones import ResNet
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import DefaultScope, Registry

from aa_det.datasets.checked_coco import missing_files
from aa_det.models.backbones.attention_resnet import (RESNET_DEFAULTS,
                                                      init_defaults)
from aa_det.utils.errors import ConfigError


def leaf_datasets(dataset: dict, path: str) -> Iterator[Tuple[dict, str]]:
    """The datasets inside wrappers (``dataset=``, ``datasets=[...]``) with
    their config keys."""
    if 'dataset' in dataset:
        yield from leaf_datasets(dataset['dataset'], f'{path}.dataset')
    elif 'datasets' in dataset:
        for i, inner in enumerate(dataset['datasets']):
            yield from leaf_datasets(inner, f'{path}.datasets[{i}]')
    else:
        yield dataset, path


def check_frozen_stages(backbone_cfg: dict):
    """An mmdet ``ResNet`` (or subclass) freezes at most its ``num_stages``:
    one more stopped its build with
    ``AttributeError: 'ResNet' object has no attribute 'layer5'``."""
    backbone_type = backbone_cfg.get('type')
    if isinstance(backbone_type, str):
        backbone_type = MODELS.get(backbone_type)
    if not (isinstance(backbone_type, type)
            and issubclass(backbone_type, ResNet)):
        return
    params = inspect.signature(backbone_type.__init__).parameters.values()
    if not any(p.name == 'num_stages' or p.kind is p.VAR_KEYWORD
               for p in params):
        return  # its stages come from elsewhere (RegNet: from arch)
    settings = {
        **RESNET_DEFAULTS,
        **init_defaults(backbone_type),
        **backbone_cfg
    }
    frozen, stages = settings['frozen_stages'], settings['num_stages']
    if isinstance(frozen, int) and isinstance(stages, int) and frozen > stages:
        raise ConfigError(
            f'model.backbone.frozen_stages={frozen} freezes more stages than '
            f'num_stages={stages} ({backbone_cfg.get("type")}; -1: none, 0: '
            f'the stem, i: the stem and stages 1 to i)')


def check_backbone_and_neck(cfg: Config):
    """The backbone builds from its settings, and the neck's ``in_channels``
    are the output channels of an mmdet ``ResNet`` (or subclass) backbone."""
    backbone_cfg = cfg.model.get('backbone')
    if not isinstance(backbone_cfg, dict):
        return
    check_frozen_stages(backbone_cfg)
    try:
        backbone = MODELS.build(backbone_cfg)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(
            f'model.backbone: {e.args[0] if e.args else e}') from None
    # mmdet's own checks (a ResNet's), often without a message: name the check
    except AssertionError as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        if not any(f'{os.sep}{package}{os.sep}' in frame.filename
                   for package in ('mmdet', 'mmcv', 'mmengine')):
            raise  # not a settings check of OpenMMLab's: keep the traceback
        where = f'{osp.basename(frame.filename)}:{frame.lineno}'
        # its message says it; the source line may be the first of several
        if str(e):
            raise ConfigError(
                f'model.backbone ({backbone_cfg.get("type")}): {e} (assert at '
                f'{where})') from None
        raise ConfigError(
            f'model.backbone ({backbone_cfg.get("type")}): failed '
            f'{frame.line or "an assert"!r} at {where}') from None
    neck = cfg.model.get('neck')
    if not isinstance(backbone, ResNet) or not isinstance(neck, dict) \
            or not isinstance(neck.get('in_channels'), (list, tuple)):
        return
    expected = [
        backbone.base_channels * 2**i * backbone.block.expansion
        for i in backbone.out_indices
    ]
    if list(neck.in_channels) != expected:
        raise ConfigError(
            f'model.neck.in_channels={list(neck.in_channels)} but the '
            f'backbone ({backbone_cfg.get("type")}, depth={backbone.depth}, '
            f'base_channels={backbone.base_channels}, '
            f'out_indices={tuple(backbone.out_indices)}) outputs {expected}')


def check_model_config(cfg: Config, splits=('train', 'val', 'test')):
    """The model against its settings and its data, for the dataloaders of
    ``splits``, with the registries of the config's ``default_scope``."""
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        check_backbone_and_neck(cfg)
        check_classification_data(cfg, splits)


#: the image extensions of mmpretrain's CustomDataset and ImageNet (a config's
#: ``extensions`` wins)
EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif')


def _mmpretrain_class(dataset_type, scope: Optional[str]):
    """The class of a dataset config's ``type`` when it is one of mmpretrain's
    registry (a name under the ``mmpretrain`` default scope,
    ``'mmpretrain.Name'``, or a class), else None."""
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
    return any(
        c.__name__ == name and c.__module__.startswith('mmpretrain.datasets')
        for c in cls.__mro__)


def _join(root: str, path: str) -> str:
    return path if not root or osp.isabs(path) else osp.join(root, path)


def _class_folders(folder: str) -> List[str]:
    return sorted(d.name for d in os.scandir(folder) if d.is_dir())


def _read_ann_file(path: str, key: str, with_label: bool,
                   num_classes: Optional[int]) -> List[str]:
    """The image paths of an annotation file, its lines parsed as mmpretrain
    parses them."""
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
                raise ConfigError(
                    f'{key}.ann_file {path}:{line_no}: expected "<image> '
                    f'<label>", got {line!r}')
            if label < 0 or (num_classes is not None and label >= num_classes):
                bound = 'is negative' if num_classes is None else \
                    f'is outside [0, model.head.num_classes={num_classes})'
                raise ConfigError(
                    f'{key}.ann_file {path}:{line_no}: label {label} {bound}')
            images.append(name)
    if not images:
        raise ConfigError(
            f'{key}.ann_file has no "<image> <label>" lines: {path}')
    return images


def _head_num_classes(cfg: Config) -> Optional[int]:
    """``model.head.num_classes`` when the config sets it to an int, else
    None."""
    head = cfg.get('model', {}).get('head')
    num_classes = head.get('num_classes') if isinstance(head, dict) else None
    return num_classes if isinstance(num_classes, int) else None


def _mmpretrain_datasets(
        cfg: Config,
        splits: Sequence[str]) -> Iterator[Tuple[dict, str, type]]:
    """The datasets of mmpretrain's registry in the dataloaders of ``splits``:
    (dataset config, its config key, its class)."""
    scope = cfg.get('default_scope')
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader or 'dataset' not in loader:
            continue
        for dataset, key in leaf_datasets(loader['dataset'],
                                          f'{split}_dataloader.dataset'):
            cls = _mmpretrain_class(
                dataset.get('type'), dataset.get('_scope_', scope))
            if cls is not None:
                yield dataset, key, cls


def _check_cifar(dataset: dict, key: str, cls: type):
    """A CIFAR dataset with ``download=False`` has its unpacked folder."""
    root = dataset.get('data_root') or ''
    folder = _join(root, cls.base_folder)
    if not dataset.get('download', True) and not osp.isdir(folder):
        raise ConfigError(
            f'{key}: no {cls.__name__} at {folder} (unpack the python '
            f'version, {cls.base_folder}.tar.gz, into data_root={root}; '
            f'download=False)')


def _image_folder(dataset: dict, key: str, cls: type) -> Tuple[str, str]:
    """The image folder of a ``CustomDataset`` (it exists) and its ``ann_file``
    under ``data_root`` (``''`` for none), as mmpretrain resolves them (an
    ``ImageNet`` split included)."""
    root = dataset.get('data_root') or ''
    prefix = dataset.get('data_prefix') or ''
    prefix = prefix.get('img_path', '') if isinstance(prefix, dict) else prefix
    ann_file = dataset.get('ann_file') or ''
    split_name = dataset.get('split')
    # as mmpretrain's ImageNet resolves a split
    if split_name and _derives_from(cls, 'ImageNet'):
        prefix = prefix or split_name
        meta = osp.join('meta', f'{split_name}.txt')
        if not ann_file and osp.isfile(_join(root, meta)):
            ann_file = meta
    folder = _join(root, prefix) if prefix else root
    if not folder or not osp.isdir(folder):
        raise ConfigError(
            f'{key}: image folder not found: '
            f'{folder or "(no data_root / data_prefix)"} (data_root={root!r}, '
            f'data_prefix={prefix!r})')
    return folder, _join(root, ann_file) if ann_file else ''


def _check_ann_file_layout(ann_path: str, folder: str, key: str,
                           with_label: bool, num_classes: Optional[int]):
    """An annotation file's lines parse, their labels are in range and the
    images they list exist."""
    images = [
        osp.join(folder, image)
        for image in _read_ann_file(ann_path, key, with_label, num_classes)
    ]
    missing = missing_files(images)
    if missing:
        raise ConfigError(
            f'{key}: {len(missing)} of {len(images)} images listed in '
            f'{ann_path} are missing, first: {missing[0]}')


def _check_folder_layout(dataset: dict, key: str, cls: type,
                         folder: str) -> List[str]:
    """The class folders of ``folder/<class>/<image>``, each with images, as
    many as the dataset's classes; returns their sorted names (the labels)."""
    classes = _class_folders(folder)
    if not classes:
        raise ConfigError(
            f'{key}: no class folders in {folder} (the folder layout: '
            f'{folder}/<class>/<image>; or give an ann_file)')
    extensions = tuple(e.lower()
                       for e in dataset.get('extensions') or EXTENSIONS)
    for name in classes:
        class_folder = osp.join(folder, name)
        if not any(f.lower().endswith(extensions)
                   for _, _, files in os.walk(class_folder) for f in files):
            raise ConfigError(f'{key}: class folder has no images '
                              f'({", ".join(extensions)}): {class_folder}')
    named = (dataset.get('metainfo') or {}).get('classes') or getattr(
        cls, 'METAINFO', {}).get('classes')
    if isinstance(named, (list, tuple)) and len(named) != len(classes):
        source = (f'{key}.metainfo.classes' if
                  (dataset.get('metainfo') or {}).get('classes') else
                  f'{cls.__name__} (its own classes)')
        raise ConfigError(
            f'{key}: {folder} has {len(classes)} class folders but {source} '
            f'names {len(named)} classes')
    return classes


def _check_same_classes(layouts: List[Tuple[str, str, List[str]]],
                        num_classes: Optional[int]):
    """The folder layouts (config key, image folder, class folders) of every
    split have the same class folders, as many as
    ``model.head.num_classes``."""
    if not layouts:
        return
    first_key, first_folder, first = layouts[0]
    for key, folder, classes in layouts[1:]:
        if classes != first:
            differ = sorted(set(classes) ^ set(first))
            raise ConfigError(
                f'{key}: {folder} has other class folders than {first_key}: '
                f'{first_folder} ({len(classes)} vs {len(first)}; only in '
                f'one: '
                f'{", ".join(differ[:5])}{", ..." if len(differ) > 5 else ""}'
                f'): the labels are the folders\' sorted order')
    if num_classes is not None and num_classes != len(first):
        raise ConfigError(
            f'model.head.num_classes={num_classes} but {first_key}: '
            f'{first_folder} has {len(first)} class folders')


def check_classification_data(cfg: Config,
                              splits: Sequence[str] = ('train', 'val',
                                                       'test')):
    """Check the mmpretrain classification datasets of the dataloaders of
    ``splits`` (see the module's docstring); a :class:`ConfigError` names the
    first problem."""
    num_classes = _head_num_classes(cfg)
    # (config key, image folder, class folders) of the folder layouts
    layouts = []
    for dataset, key, cls in _mmpretrain_datasets(cfg, splits):
        if _derives_from(cls, 'CIFAR10'):
            _check_cifar(dataset, key, cls)
            continue
        if not _derives_from(cls, 'CustomDataset'):
            continue
        folder, ann_path = _image_folder(dataset, key, cls)
        with_label = dataset.get('with_label',
                                 True) and dataset.get('split') != 'test'
        if ann_path:
            _check_ann_file_layout(ann_path, folder, key, with_label,
                                   num_classes)
        elif with_label:
            layouts.append(
                (key, folder, _check_folder_layout(dataset, key, cls, folder)))
    _check_same_classes(layouts, num_classes)


def aa_det_types() -> set:
    """The names of the types ``import aa_det`` registered, in every
    registry (mmengine's roots and their children: mmdet's, mmpretrain's)."""
    import mmengine.registry as registries
    names = set()
    stack = [r for r in vars(registries).values() if isinstance(r, Registry)]
    while stack:
        registry = stack.pop()
        names.update(
            name for name, obj in registry.module_dict.items()
            if getattr(obj, '__module__', '').split('.')[0] == 'aa_det')
        stack.extend(registry.children.values())
    return names


def _type_names(cfg) -> Iterator[str]:
    """Every string ``type`` of a config, its scope (``mmdet.``) removed."""
    if isinstance(cfg, dict):
        if isinstance(cfg.get('type'), str):
            yield cfg['type'].rpartition('.')[2]
        for value in cfg.values():
            yield from _type_names(value)
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            yield from _type_names(value)


def check_custom_imports(cfg: Config):
    """A config naming a type that ``import aa_det`` registers has
    ``custom_imports`` importing aa_det: mmdet's tools and ``init_detector``
    read nothing else (``KeyError: 'AAResNet is not in the mmdet::model
    registry'``), so ours refuse such a config as theirs do."""
    imports = (cfg.get('custom_imports') or {}).get('imports') or []
    imports = [imports] if isinstance(imports, str) else imports
    if any(name.split('.')[0] == 'aa_det' for name in imports):
        return
    ours = aa_det_types()
    named = next((name for name in _type_names(cfg._cfg_dict) if name in ours),
                 None)
    if named is not None:
        raise ConfigError(
            f'config {cfg.filename} names {named}, which `import aa_det` '
            "registers: add custom_imports=dict(imports=['aa_det'], "
            'allow_failed_imports=False)')


def check_run_config(cfg: Config,
                     splits: Sequence[str] = ('train', 'val', 'test')):
    """Every check of this module, for the dataloaders of ``splits``."""
    check_custom_imports(cfg)
    check_model_config(cfg, splits)
