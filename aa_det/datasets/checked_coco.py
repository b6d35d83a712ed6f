"""mmdet's ``CocoDataset`` with what it does silently said out loud.

:func:`aa_det.engine.load_config` substitutes :class:`CheckedCocoDataset` for
``CocoDataset`` in the dataloaders. Same arguments, samples and metainfo; in
addition, when the dataset is built (before the first iteration):

* a JSON syntax error names the file, line and column;
* the annotations mmdet skips (zero-size boxes, boxes outside the image as the
  JSON's ``width`` / ``height`` give it, ``category_id`` not among the classes)
  are counted in one log line per dataset;
* every image the dataset will load must exist (one directory listing per image
  folder, not one ``stat`` per image).

Decoding every image and comparing its size with the JSON is the opt-in
``tools/check_dataset.py``.
"""
import json
import os
import os.path as osp
from collections import Counter
from contextlib import contextmanager
from typing import List

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS
from mmengine.logging import print_log

from ..engine.errors import ConfigError


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


@DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """mmdet's :class:`CocoDataset`, checked when built (see the module docstring).

    Args:
        *args: Positional arguments of :class:`CocoDataset`.
        **kwargs: Keyword arguments of :class:`CocoDataset`.
    """

    def load_data_list(self) -> List[dict]:
        """mmdet's, counting skipped annotations; a JSON syntax error names the file."""
        self.skipped, self.num_annotations = Counter(), 0
        with naming_json_errors(self.ann_file):
            return super().load_data_list()

    def parse_data_info(self, raw_data_info: dict) -> dict:
        """mmdet's, counting the annotations it leaves out by reason."""
        data_info = super().parse_data_info(raw_data_info)
        anns, img = raw_data_info['raw_ann_info'], raw_data_info['raw_img_info']
        self.num_annotations += len(anns)
        if len(data_info['instances']) < len(anns):
            self.skipped.update(r for r in (skip_reason(a, img['width'], img['height'], self.cat_ids)
                                            for a in anns) if r)
        return data_info

    def filter_data(self) -> List[dict]:
        """mmdet's filter, then one log line of counts; the images it keeps must exist."""
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
            if missing:
                raise ConfigError(f'{len(missing)} of {len(paths)} images listed in {self.ann_file} are missing, '
                                  f'first: {missing[0]}')
        return data_list
