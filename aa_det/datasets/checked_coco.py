"""mmdet's ``CocoDataset`` with what it does silently said out loud.

Our dataset bases (``configs/_base_/datasets/``) name :class:`CheckedCocoDataset`
in the dataloaders. Same arguments, samples and metainfo; in addition, when the
dataset is built (before the first iteration):

* a missing annotation file, or one that is no COCO dict, is named;
* the classes (``metainfo.classes``, or the dataset's own) must be among the
  file's ``categories``, in its order (mmdet would skip a missing one, or number
  the labels in the file's order and name them in the config's);

* a JSON syntax error names the file, line and column;
* the annotations mmdet skips (zero-size boxes, boxes outside the image as the
  JSON's ``width`` / ``height`` give it, ``category_id`` not among the classes)
  are counted in one log line per dataset;
* a COCO dict nested one level down, and ``id`` / ``category_id`` given as strings, are named
  in one line (mmdet: ``KeyError: 'categories'``, an empty dataset);
* every image the dataset will load must exist (one directory listing per image
  folder, not one ``stat`` per image);
* image headers (no decode) must parse and give the JSON's ``width`` / ``height``, and a PNG
  must end with its ``IEND`` chunk (a truncated file): every image of a set of up to
  :data:`HEADER_CHECK_LIMIT`, a fixed sample of that many from a larger one;
* a validation or test set without annotations is a warning (every COCO metric would be -1).

Decoding every image is the opt-in ``tools/check_dataset.py``.
"""
import json
import os
import os.path as osp
import random
from collections import Counter
from contextlib import contextmanager
from typing import List

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS
from mmengine.logging import print_log
from PIL import Image, UnidentifiedImageError

#: image headers read per dataset: all of a set up to this size, a fixed sample of a larger one
HEADER_CHECK_LIMIT = 10000
#: EXIF orientations that swap width and height (the decoders apply them)
_TRANSPOSED = (5, 6, 7, 8)

from ..utils.errors import ConfigError


@contextmanager
def naming_json_errors(path: str):
    """Turn a ``json.JSONDecodeError`` inside the block into a :class:`ConfigError` naming
    ``path``, line and column."""
    try:
        yield
    except json.JSONDecodeError as e:
        raise ConfigError(f'annotation file is not valid JSON: {path}, line {e.lineno}, column {e.colno}: '
                          f'{e.msg}') from None


def skip_reason(ann: dict, width: float, height: float, cat_ids) -> str:
    """Why mmdet's ``CocoDataset.parse_data_info`` leaves a COCO annotation out, or ``''``.

    The conditions are mmdet 3.3's, named in this order: a category not trained
    first, then a zero-size box (before it would count as outside).

    Args:
        ann (dict): A COCO annotation (``bbox`` as ``[x, y, w, h]``, ``area``,
            ``category_id``, optional ``ignore``).
        width (float): The image width the JSON gives.
        height (float): The image height the JSON gives.
        cat_ids (Container[int]): The category ids the dataset trains.

    Returns:
        str: ``'marked ignore'``, ``'category_id not in the classes'``,
        ``'zero-size'``, ``'outside the image'`` or ``''`` (kept).
    """
    if ann.get('ignore', False):
        return 'marked ignore'
    if ann['category_id'] not in cat_ids:
        return 'category_id not in the classes'
    x, y, w, h = ann['bbox']
    if ann['area'] <= 0 or w < 1 or h < 1:
        return 'zero-size'
    if max(0, min(x + w, width) - max(x, 0)) * max(0, min(y + h, height) - max(y, 0)) == 0:
        return 'outside the image'
    return ''


def missing_files(paths: List[str]) -> List[str]:
    """The ``paths`` that are not files: one ``os.scandir`` per folder (a ``stat`` per
    path only where the folder listing names a symlink)."""
    by_folder = {}
    for path in paths:
        by_folder.setdefault(osp.dirname(path), []).append(path)
    missing = []
    for folder, listed in by_folder.items():
        try:
            with os.scandir(folder or '.') as entries:
                files = {e.name for e in entries if e.is_file()}  # follows symlinks, stats only them
        except OSError:
            files = set()
        missing += [path for path in listed if osp.basename(path) not in files]
    return missing


def image_header_problem(path: str, width: int, height: int) -> str:
    """What is wrong with the image file ``path`` that the JSON says is ``width`` x ``height``,
    from its header alone (no decode), or ``''``.

    Returns:
        str: ``'not an image ...'``, ``'truncated ...'`` (a PNG without its ``IEND`` chunk)
        or ``'is WxH, the annotation file says ...'``; ``''`` when it looks right.
    """
    try:
        with Image.open(path) as img:
            size, fmt = img.size, img.format
            orientation = img.getexif().get(0x0112) if size == (height, width) != (width, height) else None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        return f'not an image PIL can read ({type(e).__name__}: {e})'
    if fmt == 'PNG':
        with open(path, 'rb') as f:
            f.seek(max(0, osp.getsize(path) - 64))
            if b'IEND' not in f.read():
                return 'truncated (the PNG has no IEND chunk at its end)'
    if size != (width, height) and orientation not in _TRANSPOSED:
        return f'is {size[0]}x{size[1]}, the annotation file says width {width}, height {height}'
    return ''


def check_image_headers(data_list: List[dict], ann_file: str, limit: int = HEADER_CHECK_LIMIT):
    """:func:`image_header_problem` for every image of ``data_list`` (``img_path``, ``width``,
    ``height``), or for a fixed sample of ``limit`` of them.

    Raises:
        ConfigError: one line naming the first bad file, what is wrong, and how many were bad.
    """
    infos = data_list if len(data_list) <= limit else random.Random(0).sample(data_list, limit)
    bad = [(info['img_path'], problem) for info in infos
           for problem in [image_header_problem(info['img_path'], info['width'], info['height'])] if problem]
    if bad:
        checked = 'all' if len(infos) == len(data_list) else f'a sample of {len(infos)}'
        raise ConfigError(f'{len(bad)} of {len(infos)} images checked ({checked} of {len(data_list)} in {ann_file}) '
                          f'are wrong, first: {bad[0][0]} {bad[0][1]} (tools/check_dataset.py CONFIG decodes them all)')


def nesting_hint(path: str) -> str:
    """Why an annotation file has no top-level COCO keys: the key its COCO dict is nested
    under, or the top-level keys it has."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        return f'it holds a {type(data).__name__}'
    nested = [key for key, value in data.items() if isinstance(value, dict) and 'images' in value]
    if nested:
        return f'the COCO dict is nested under the key {nested[0]!r}; save that dict itself'
    return f'its top-level keys are {sorted(data)[:8]}'


@DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """mmdet's :class:`CocoDataset`, checked when built (see the module docstring).

    Args:
        *args: Positional arguments of :class:`CocoDataset`.
        **kwargs: Keyword arguments of :class:`CocoDataset`.
    """

    def load_data_list(self) -> List[dict]:
        """mmdet's, counting skipped annotations; a missing file, a JSON syntax error, a file that is no
        COCO dict and classes that are not the file's categories in its order are named."""
        self.skipped, self.num_annotations, self._ids_checked = Counter(), 0, False
        if self.backend_args is None and not osp.isfile(self.ann_file):
            raise ConfigError(f'annotation file not found: {self.ann_file}')
        try:
            with naming_json_errors(self.ann_file):
                data_list = super().load_data_list()
        except KeyError as e:  # pycocotools indexes only the keys it finds at the top level
            if e.args and e.args[0] in ('images', 'annotations', 'categories'):
                raise ConfigError(f'annotation file has no top-level {e.args[0]!r}: {self.ann_file}: '
                                  f'{nesting_hint(self.ann_file)}') from None
            raise
        except AssertionError:  # pycocotools: 'annotation file format ... not supported'
            raise ConfigError(f'annotation file is not a JSON object ({{...}}): {self.ann_file}: '
                              f'{nesting_hint(self.ann_file)}') from None
        self._check_classes()
        return data_list

    def _check_classes(self):
        """The dataset's classes are among the file's categories, in the file's order: mmdet numbers
        the labels in the file's order and skips the annotations of a class it does not find."""
        names = [cat.get('name') for cat in self.coco.dataset['categories']]
        classes = tuple(self.metainfo['classes'])
        missing = [c for c in classes if c not in names]
        if missing:
            raise ConfigError(f'metainfo.classes: {", ".join(map(repr, missing))} not among the categories of '
                              f'{self.ann_file} ({", ".join(map(repr, names))})')
        in_file_order = tuple(n for n in names if n in classes)
        if classes != in_file_order:
            raise ConfigError(f'metainfo.classes={classes} are in another order than the categories of '
                              f"{self.ann_file}; mmdet numbers the labels in the file's order: {in_file_order}")

    def _check_ids(self, anns: List[dict]):
        """Category ids are ints (strings never match, and mmdet finds no annotation at all)."""
        if not self._ids_checked:
            self._ids_checked = True
            for cat in self.coco.dataset.get('categories', []):
                if not isinstance(cat.get('id'), int):
                    raise ConfigError(f'annotation file {self.ann_file}: category ids must be ints; category '
                                      f'{cat.get("name")!r} has id {cat.get("id")!r}')
        for ann in anns:
            if not isinstance(ann.get('category_id'), int):
                raise ConfigError(f'annotation file {self.ann_file}: category_id must be an int; annotation '
                                  f'{ann.get("id")} has {ann.get("category_id")!r}')

    def parse_data_info(self, raw_data_info: dict) -> dict:
        """mmdet's, counting the annotations it leaves out by reason."""
        anns, img = raw_data_info['raw_ann_info'], raw_data_info['raw_img_info']
        self._check_ids(anns)
        data_info = super().parse_data_info(raw_data_info)
        self.num_annotations += len(anns)
        if len(data_info['instances']) < len(anns):
            self.skipped.update(r for r in (skip_reason(a, img['width'], img['height'], self.cat_ids)
                                            for a in anns) if r)
        return data_info

    def filter_data(self) -> List[dict]:
        """mmdet's filter, then one log line of counts; the images it keeps must exist and
        their headers fit the JSON (:func:`check_image_headers`)."""
        num_images = len(self.data_list)
        data_list = super().filter_data()
        counts = ', '.join(f'{n} {reason}' for reason, n in self.skipped.most_common())
        left_out = num_images - len(data_list)
        print_log(f'aa_det: {self.ann_file}: {num_images} images, {self.num_annotations} annotations; '
                  f'skipped annotations: {counts or "none"}'
                  + (f'; {left_out} images left out by filter_cfg' if left_out else '')
                  + ('' if not counts else ' (tools/check_dataset.py CONFIG lists them)'),
                  logger='current', level=30 if counts else 20)
        paths = [info['img_path'] for info in data_list]
        if self.backend_args is None and paths and '://' not in paths[0]:
            missing = missing_files(paths)
            folder = osp.dirname(missing[0]) if missing else ''
            if missing and not osp.isdir(folder):
                raise ConfigError(f'image folder not found: {folder} (data_prefix.img), listed in {self.ann_file}')
            if missing:
                raise ConfigError(f'{len(missing)} of {len(paths)} images listed in {self.ann_file} are missing, '
                                  f'first: {missing[0]}')
            check_image_headers(data_list, self.ann_file)
        if self.test_mode and self.num_annotations == 0:
            print_log(f'aa_det: {self.ann_file} has no annotations: every COCO metric of this set will be -1',
                      logger='current', level=30)
        return data_list
