"""Check a detection config's COCO data in full, before a long run (opt-in;
training checks only that the listed images exist).

    .venv/bin/python tools/check_dataset.py CONFIG [--splits train val test]
        [--workers N] [--cfg-options k=v ...]

For every annotation file of the chosen dataloaders: every listed image exists,
decodes completely (Pillow: a truncated PNG / JPEG fails) and has the ``width``
/ ``height`` the JSON gives (mmdet clips and drops boxes by those); every
annotation's ``image_id`` and ``category_id`` are in the file; the config's
classes are categories of the file; and the annotations mmdet would skip are
counted: zero-size, outside the image, category not among the config's classes.
Prints the counts with the first examples; errors exit 2 with one ``aa_det:``
line, warnings alone exit 0.

What a config cannot say: mmdet's datasets decode no image before a run
and drop these annotations silently; this tool is the full check, opt-in.
mmdet's own ``parse_data_info`` decides which annotations are skipped.
"""
import argparse
import json
import os
import os.path as osp
import sys
from collections import defaultdict
from multiprocessing import Pool

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), 'env'))
from env_check import require_env, run_cli  # noqa: E402

require_env()

from config_runner import load_config  # noqa: E402
from mmdet.datasets import CocoDataset  # noqa: E402
from mmengine.config import DictAction  # noqa: E402
from PIL import Image  # noqa: E402

from aa_det.datasets.checked_coco import naming_json_errors  # noqa: E402
from aa_det.utils import ConfigError  # noqa: E402

EXAMPLES = 3


class MmdetFilter:
    """Which COCO annotations mmdet's ``CocoDataset.parse_data_info`` (its
    annotation filter) leaves out: mmdet's own method decides, on a dataset
    that loads nothing; :func:`why` only names the reason of a decision.

    Args:
        cat_ids (Sequence[int]): The category ids the dataset trains.
    """

    def __init__(self, cat_ids):
        self.dataset = CocoDataset(
            ann_file='', data_prefix=dict(img=''), lazy_init=True)
        self.dataset.cat_ids = list(cat_ids)
        self.dataset.cat2label = {i: n for n, i in enumerate(cat_ids)}

    def drops(self, ann: dict, img: dict) -> bool:
        """Whether mmdet leaves ``ann`` out of the image ``img`` (a COCO
        image: ``id``, ``file_name``, ``width``, ``height``)."""
        info = self.dataset.parse_data_info({
            'raw_img_info':
            dict(img, img_id=img['id']),
            'raw_ann_info': [ann]
        })
        return not info['instances']

    def why(self, ann: dict, img: dict) -> str:
        """The reason mmdet dropped ``ann``, named: ``'marked ignore'``,
        ``'category_id not in the classes'``, ``'zero-size'`` or
        ``'outside the image'`` (the first that holds, in this order)."""
        x, y, w, h = ann['bbox']
        inside = max(0, min(x + w, img['width']) - max(x, 0)) \
            * max(0, min(y + h, img['height']) - max(y, 0))
        for reason, holds in (('marked ignore', ann.get('ignore', False)),
                              ('category_id not in the classes',
                               ann['category_id'] not in self.dataset.cat_ids),
                              ('zero-size', ann['area'] <= 0 or w < 1
                               or h < 1), ('outside the image', inside == 0)):
            if holds:
                return reason
        return "mmdet's filter"


def parse_args():
    parser = argparse.ArgumentParser(
        description='Check the COCO data of a config: images decode and match '
        'the JSON sizes, annotations are usable')
    parser.add_argument('config', help='config file path')
    parser.add_argument(
        '--splits',
        nargs='+',
        default=['train', 'val', 'test'],
        choices=['train', 'val', 'test'],
        help='the dataloaders to check')
    parser.add_argument(
        '--workers',
        type=int,
        default=os.cpu_count(),
        help='processes decoding images')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value')
    return parser.parse_args()


def image_size(path: str):
    """``(width, height)`` of a completely decoded image, ``'missing'``, or why
    it does not decode."""
    try:
        with Image.open(path) as image:
            image.load()
            return image.size
    except FileNotFoundError:
        return 'missing'
    # Pillow raises OSError, SyntaxError, ValueError, ...
    except Exception as e:  # noqa: BLE001
        return f'{type(e).__name__}: {e}'


def coco_datasets(cfg, splits):
    """``(ann_file, image folder, classes)`` of each COCO dataset of
    ``splits``, once each."""
    found = {}
    for split in splits:
        dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset')
        # wrappers (RepeatDataset, ...)
        while dataset is not None and 'dataset' in dataset:
            dataset = dataset['dataset']
        if not dataset or dataset.get('type') not in ('CocoDataset',
                                                      'CheckedCocoDataset'):
            continue
        root = dataset.get('data_root') or ''
        ann = osp.join(root, dataset['ann_file'])
        img_dir = osp.join(root, (dataset.get('data_prefix')
                                  or {}).get('img', ''))
        classes = (dataset.get('metainfo') or {}).get('classes')
        found.setdefault((ann, img_dir), tuple(classes) if classes else None)
    return [(ann, img_dir, classes)
            for (ann, img_dir), classes in found.items()]


def check_file(ann_file, img_dir, classes, pool):
    """Print the problems of one annotation file; return the number of error
    kinds."""
    if not osp.isfile(ann_file):
        raise ConfigError(f'annotation file not found: {ann_file}')
    with open(ann_file) as f, naming_json_errors(ann_file):
        coco = json.load(f)
    images = {img['id']: img for img in coco.get('images', [])}
    categories = {cat['id']: cat['name'] for cat in coco.get('categories', [])}
    errors, warnings = defaultdict(list), defaultdict(list)
    if classes:
        for name in sorted(set(classes) - set(categories.values())):
            errors[
                'class of the config that is no category of the file'].append(
                    repr(name))
    mmdet = MmdetFilter([
        i for i, name in categories.items() if not classes or name in classes
    ])

    order = list(images.values())
    sizes = pool.imap(
        image_size, [osp.join(img_dir, img['file_name']) for img in order],
        chunksize=16)
    for img, size in zip(order, sizes):
        if size == 'missing':
            errors['images that are missing'].append(img['file_name'])
        elif isinstance(size, str):
            errors['images that do not decode'].append(
                f'{img["file_name"]} ({size})')
        elif size != (img['width'], img['height']):
            errors['images whose size differs from width/height in the JSON '
                   '(mmdet drops boxes by them)'].append(
                       f'{img["file_name"]} is {size[0]}x{size[1]}, the JSON '
                       f'says {img["width"]}x{img["height"]}')

    for ann in coco.get('annotations', []):
        img = images.get(ann['image_id'])
        where = f'annotation id {ann.get("id")}'
        if img is None:
            errors['annotations whose image_id is not in images'].append(
                f'{where}: image_id {ann["image_id"]}')
            continue
        if ann['category_id'] not in categories:
            errors['annotations with an unknown category_id'].append(
                f'{where}: category_id {ann["category_id"]}')
            continue
        reason = mmdet.why(ann, img) if mmdet.drops(ann, img) else ''
        if reason and reason != 'marked ignore':
            warnings[f'annotations mmdet skips: {reason}'].append(
                f'{where} on {img["file_name"]}: '
                f'bbox {ann["bbox"]}')

    print(f'{ann_file}: {len(images)} images in {img_dir}, '
          f'{len(coco.get("annotations", []))} annotations, {len(categories)} '
          f'categories')
    for kind, found in [('error', errors), ('warning', warnings)]:
        for what, items in found.items():
            print(
                f'  {kind}: {len(items)} {what}: {"; ".join(items[:EXAMPLES])}'
                + (' ...' if len(items) > EXAMPLES else ''))
    if not errors and not warnings:
        print('  ok')
    return len(errors)


def main():
    args = parse_args()
    cfg = load_config(args.config, cfg_options=args.cfg_options)
    datasets = coco_datasets(cfg, args.splits)
    if not datasets:
        raise ConfigError(
            f'{args.config}: no COCO dataset in the {"/".join(args.splits)} '
            f'dataloaders')
    with Pool(max(1, args.workers)) as pool:
        failed = [
            ann for ann, img_dir, classes in datasets
            if check_file(ann, img_dir, classes, pool)
        ]
    if failed:
        raise ConfigError(
            f'check_dataset: errors (above) in {", ".join(failed)}')


if __name__ == '__main__':
    run_cli(main)
