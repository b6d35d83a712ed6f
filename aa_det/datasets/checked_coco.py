"""mmdet's ``CocoDataset`` with what it does silently said out loud:
:class:`CheckedCocoDataset`, which our dataset bases
(``configs/_base_/datasets/``) name, so that every tool builds it."""
import json
import os
import os.path as osp
import random
from contextlib import contextmanager
from typing import List

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS
from mmengine.logging import print_log
from PIL import Image, UnidentifiedImageError

from ..utils.errors import ConfigError

#: image headers read per dataset: all of a set up to this size, a fixed sample
#: of a larger one
HEADER_CHECK_LIMIT = 10000
#: EXIF orientations that swap width and height (the decoders apply them)
_TRANSPOSED = (5, 6, 7, 8)


@contextmanager
def naming_json_errors(path: str):
    """Turn a ``json.JSONDecodeError`` inside the block into a
    :class:`ConfigError` naming ``path``, line and column."""
    try:
        yield
    except json.JSONDecodeError as e:
        raise ConfigError(
            f'annotation file is not valid JSON: {path}, line {e.lineno}, '
            f'column {e.colno}: {e.msg}') from None


def missing_files(paths: List[str]) -> List[str]:
    """The ``paths`` that are not files: one ``os.scandir`` per folder (a
    ``stat`` per path only where the folder listing names a symlink)."""
    by_folder = {}
    for path in paths:
        by_folder.setdefault(osp.dirname(path), []).append(path)
    missing = []
    for folder, listed in by_folder.items():
        try:
            with os.scandir(folder or '.') as entries:
                # follows symlinks, stats only them
                files = {e.name for e in entries if e.is_file()}
        except OSError:
            files = set()
        missing += [path for path in listed if osp.basename(path) not in files]
    return missing


def image_header_problem(path: str, width: int, height: int) -> str:
    """What is wrong with the image ``path`` that the JSON says is ``width`` x
    ``height``, from its header alone: ``'not an image ...'``,
    ``'truncated ...'`` (a PNG without its ``IEND`` chunk),
    ``'is WxH, the annotation file says ...'``, or ``''`` when it looks
    right."""
    try:
        with Image.open(path) as img:
            size, fmt = img.size, img.format
            orientation = img.getexif().get(0x0112) if size == (
                height, width) != (width, height) else None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        return f'not an image PIL can read ({type(e).__name__}: {e})'
    if fmt == 'PNG':
        with open(path, 'rb') as f:
            f.seek(max(0, osp.getsize(path) - 64))
            if b'IEND' not in f.read():
                return 'truncated (the PNG has no IEND chunk at its end)'
    if size != (width, height) and orientation not in _TRANSPOSED:
        return (f'is {size[0]}x{size[1]}, the annotation file says width '
                f'{width}, height {height}')
    return ''


def check_image_headers(data_list: List[dict],
                        ann_file: str,
                        limit: int = HEADER_CHECK_LIMIT):
    """:func:`image_header_problem` for every image of ``data_list``
    (``img_path``, ``width``, ``height``), or a fixed sample of ``limit`` of
    them; one line naming the first bad file and how many were bad."""
    infos = data_list if len(data_list) <= limit else random.Random(0).sample(
        data_list, limit)
    bad = [(info['img_path'], problem) for info in infos for problem in [
        image_header_problem(info['img_path'], info['width'], info['height'])
    ] if problem]
    if bad:
        checked = 'all' if len(infos) == len(
            data_list) else f'a sample of {len(infos)}'
        raise ConfigError(
            f'{len(bad)} of {len(infos)} images checked ({checked} of '
            f'{len(data_list)} in {ann_file}) are wrong, first: {bad[0][0]} '
            f'{bad[0][1]} (tools/check_dataset.py CONFIG decodes them all)')


def check_images(data_list: List[dict], ann_file: str):
    """The images of ``data_list`` (``img_path``, ``width``, ``height``, as
    mmdet's datasets list them) exist (:func:`missing_files`) and their headers
    fit (:func:`check_image_headers`); one line for the first problem. Images
    behind a URL are left to the loader."""
    paths = [info['img_path'] for info in data_list]
    if not paths or '://' in paths[0]:
        return
    missing = missing_files(paths)
    if missing and not osp.isdir(osp.dirname(missing[0])):
        raise ConfigError(f'image folder not found: {osp.dirname(missing[0])} '
                          f'(data_prefix.img), listed in {ann_file}')
    if missing:
        raise ConfigError(
            f'{len(missing)} of {len(paths)} images listed in {ann_file} are '
            f'missing, first: {missing[0]}')
    check_image_headers(data_list, ann_file)


def nesting_hint(path: str) -> str:
    """Why an annotation file has no top-level COCO keys: the key its COCO dict
    is nested under, or what it holds."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        return f'it holds a {type(data).__name__}'
    nested = [
        key for key, value in data.items()
        if isinstance(value, dict) and 'images' in value
    ]
    if nested:
        return (f'the COCO dict is nested under the key {nested[0]!r}; save '
                f'that dict itself')
    return f'its top-level keys are {sorted(data)[:8]}'


@DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """mmdet's :class:`CocoDataset` (its arguments, samples and metainfo),
    checked when built, before the first iteration (the validation set too),
    each problem one :class:`ConfigError` line:

    * a missing annotation file, one that is no COCO dict (or whose COCO dict
      is nested), a JSON syntax error (file, line and column), ids given as
      strings;
    * classes (``metainfo.classes``, or the dataset's own) not among the file's
      ``categories`` in its order (mmdet would skip a missing one, or number
      the labels in the file's order);
    * images missing (one directory listing per folder), or whose headers (no
      decode) do not parse, do not give the JSON's size, or end a PNG without
      ``IEND``: every image of a set of up to :data:`HEADER_CHECK_LIMIT`, a
      fixed sample of that many from a larger one.

    One log line counts the annotations mmdet leaves out; a validation or test
    set without annotations is a warning (every COCO metric would be -1).
    """

    def load_data_list(self) -> List[dict]:
        """mmdet's, with the file, its ids and the classes checked and the
        annotations counted."""
        self.num_annotations, self.num_instances, self._ids_checked = (0, 0,
                                                                       False)
        if self.backend_args is None and not osp.isfile(self.ann_file):
            raise ConfigError(f'annotation file not found: {self.ann_file}')
        try:
            with naming_json_errors(self.ann_file):
                data_list = super().load_data_list()
        # pycocotools indexes only the keys it finds at the top level
        except KeyError as e:
            if e.args and e.args[0] in ('images', 'annotations', 'categories'):
                raise ConfigError(
                    f'annotation file has no top-level {e.args[0]!r}: '
                    f'{self.ann_file}: {nesting_hint(self.ann_file)}'
                ) from None
            raise
        # pycocotools: 'annotation file format ... not supported'
        except AssertionError:
            raise ConfigError(
                f'annotation file is not a JSON object ({{...}}): '
                f'{self.ann_file}: {nesting_hint(self.ann_file)}') from None
        # pycocotools indexes entries that are no dicts
        except (TypeError, AttributeError) as e:
            raise ConfigError(
                f'annotation file is not COCO format: {self.ann_file}: '
                f'{type(e).__name__}: {e}') from None
        return data_list

    def _check_categories(self):
        """Category ids are ints; the classes are among the categories, in the
        file's order."""
        # mmdet deletes self.coco once the file is parsed
        categories = self.coco.dataset['categories']
        for cat in categories:
            if not isinstance(cat.get('id'), int):
                raise ConfigError(
                    f'annotation file {self.ann_file}: category ids must be '
                    f'ints; category {cat.get("name")!r} has id '
                    f'{cat.get("id")!r}')
        names, classes = [cat.get('name') for cat in categories
                          ], tuple(self.metainfo['classes'])
        missing = [c for c in classes if c not in names]
        if missing:
            raise ConfigError(
                f'metainfo.classes: {", ".join(map(repr, missing))} not among '
                f'the categories of {self.ann_file} '
                f'({", ".join(map(repr, names))})')
        in_file_order = tuple(n for n in names if n in classes)
        if classes != in_file_order:
            raise ConfigError(
                f'metainfo.classes={classes} are in another order than the '
                f'categories of '
                f"{self.ann_file}; mmdet numbers the labels in the file's "
                f"order: {in_file_order}")

    def parse_data_info(self, raw_data_info: dict) -> dict:
        """mmdet's, with ids that are ints (strings never match: mmdet would
        find no annotation at all), the classes checked against the categories,
        and the annotations it keeps counted."""
        anns = raw_data_info['raw_ann_info']
        if not self._ids_checked:
            self._ids_checked = True
            self._check_categories()
        for ann in anns:
            if not isinstance(ann.get('category_id'), int):
                raise ConfigError(
                    f'annotation file {self.ann_file}: category_id must be an '
                    f'int; annotation {ann.get("id")} has '
                    f'{ann.get("category_id")!r}')
        data_info = super().parse_data_info(raw_data_info)
        self.num_annotations += len(anns)
        self.num_instances += len(data_info['instances'])
        return data_info

    def filter_data(self) -> List[dict]:
        """mmdet's filter, then one log line of counts; the images it keeps
        must exist and their headers fit the JSON."""
        num_images, data_list = len(self.data_list), super().filter_data()
        skipped, left_out = self.num_annotations - self.num_instances, len(
            self.data_list) - len(data_list)
        print_log(
            f'aa_det: {self.ann_file}: {num_images} images, '
            f'{self.num_annotations} annotations; skipped annotations: '
            f'{skipped or "none"}' +
            (f'; {left_out} images left out by filter_cfg' if left_out else '')
            + ('' if not skipped else
               ' (marked ignore, category not in the classes, zero-size or '
               'outside the image: tools/check_dataset.py CONFIG lists them)'),
            logger='current',
            level=30 if skipped else 20)
        if self.backend_args is None:
            check_images(data_list, self.ann_file)
        if self.test_mode and self.num_annotations == 0:
            print_log(
                f'aa_det: {self.ann_file} has no annotations: every COCO '
                f'metric of this set will be -1',
                logger='current',
                level=30)
        return data_list
