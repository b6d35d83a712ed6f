"""Check a detection config's COCO data in full, before a long run (opt-in; training checks
only that the listed images exist).

    .venv/bin/python tools/check_dataset.py CONFIG [--splits train val test] [--workers N]
        [--cfg-options k=v ...]

For every annotation file of the chosen dataloaders: every listed image exists, decodes
completely (Pillow: a truncated PNG / JPEG fails) and has the ``width`` / ``height`` the JSON
gives (mmdet clips and drops boxes by those); every annotation's ``image_id`` and
``category_id`` are in the file; the config's classes are categories of the file; and the
annotations mmdet would skip are counted: zero-size, outside the image, category not among
the config's classes. Prints the counts with the first examples; errors exit 2 with one
``aa_det:`` line, warnings alone exit 0.
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

from mmengine.config import DictAction  # noqa: E402
from PIL import Image  # noqa: E402

from aa_det.datasets.checked_coco import naming_json_errors  # noqa: E402
from aa_det.utils import ConfigError  # noqa: E402
from config_runner import load_config  # noqa: E402

EXAMPLES = 3


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


def parse_args():
    parser = argparse.ArgumentParser(description='Check the COCO data of a config: images decode and match '
                                                 'the JSON sizes, annotations are usable')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--splits', nargs='+', default=['train', 'val', 'test'], choices=['train', 'val', 'test'],
                        help='the dataloaders to check')
    parser.add_argument('--workers', type=int, default=os.cpu_count(), help='processes decoding images')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value')
    return parser.parse_args()


def image_size(path: str):
    """``(width, height)`` of a completely decoded image, ``'missing'``, or why it does not decode."""
    try:
        with Image.open(path) as image:
            image.load()
            return image.size
    except FileNotFoundError:
        return 'missing'
    except Exception as e:  # noqa: BLE001  Pillow raises OSError, SyntaxError, ValueError, ...
        return f'{type(e).__name__}: {e}'


def coco_datasets(cfg, splits):
    """``(ann_file, image folder, classes)`` of each COCO dataset of ``splits``, once each."""
    found = {}
    for split in splits:
        dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset')
        while dataset is not None and 'dataset' in dataset:  # wrappers (RepeatDataset, ...)
            dataset = dataset['dataset']
        if not dataset or dataset.get('type') not in ('CocoDataset', 'CheckedCocoDataset'):
            continue
        root = dataset.get('data_root') or ''
        ann = osp.join(root, dataset['ann_file'])
        img_dir = osp.join(root, (dataset.get('data_prefix') or {}).get('img', ''))
        classes = (dataset.get('metainfo') or {}).get('classes')
        found.setdefault((ann, img_dir), tuple(classes) if classes else None)
    return [(ann, img_dir, classes) for (ann, img_dir), classes in found.items()]


def check_file(ann_file, img_dir, classes, pool):
    """Print the problems of one annotation file; return the number of error kinds."""
    if not osp.isfile(ann_file):
        raise ConfigError(f'annotation file not found: {ann_file}')
    with open(ann_file) as f, naming_json_errors(ann_file):
        coco = json.load(f)
    images = {img['id']: img for img in coco.get('images', [])}
    categories = {cat['id']: cat['name'] for cat in coco.get('categories', [])}
    errors, warnings = defaultdict(list), defaultdict(list)
    if classes:
        for name in sorted(set(classes) - set(categories.values())):
            errors['class of the config that is no category of the file'].append(repr(name))
    cat_ids = {i for i, name in categories.items() if not classes or name in classes}

    order = list(images.values())
    sizes = pool.imap(image_size, [osp.join(img_dir, img['file_name']) for img in order], chunksize=16)
    for img, size in zip(order, sizes):
        if size == 'missing':
            errors['images that are missing'].append(img['file_name'])
        elif isinstance(size, str):
            errors['images that do not decode'].append(f'{img["file_name"]} ({size})')
        elif size != (img['width'], img['height']):
            errors['images whose size differs from width/height in the JSON (mmdet drops boxes by them)'].append(
                f'{img["file_name"]} is {size[0]}x{size[1]}, the JSON says {img["width"]}x{img["height"]}')

    for ann in coco.get('annotations', []):
        img = images.get(ann['image_id'])
        where = f'annotation id {ann.get("id")}'
        if img is None:
            errors['annotations whose image_id is not in images'].append(f'{where}: image_id {ann["image_id"]}')
            continue
        if ann['category_id'] not in categories:
            errors['annotations with an unknown category_id'].append(f'{where}: category_id {ann["category_id"]}')
            continue
        reason = skip_reason(ann, img['width'], img['height'], cat_ids)
        if reason and reason != 'marked ignore':
            warnings[f'annotations mmdet skips: {reason}'].append(f'{where} on {img["file_name"]}: '
                                                                   f'bbox {ann["bbox"]}')

    print(f'{ann_file}: {len(images)} images in {img_dir}, {len(coco.get("annotations", []))} annotations, '
          f'{len(categories)} categories')
    for kind, found in [('error', errors), ('warning', warnings)]:
        for what, items in found.items():
            print(f'  {kind}: {len(items)} {what}: {"; ".join(items[:EXAMPLES])}'
                  + (' ...' if len(items) > EXAMPLES else ''))
    if not errors and not warnings:
        print('  ok')
    return len(errors)


def main():
    args = parse_args()
    cfg = load_config(args.config, cfg_options=args.cfg_options)
    datasets = coco_datasets(cfg, args.splits)
    if not datasets:
        raise ConfigError(f'{args.config}: no COCO dataset in the {"/".join(args.splits)} dataloaders')
    with Pool(max(1, args.workers)) as pool:
        failed = [ann for ann, img_dir, classes in datasets if check_file(ann, img_dir, classes, pool)]
    if failed:
        raise ConfigError(f'check_dataset: errors (above) in {", ".join(failed)}')


if __name__ == '__main__':
    run_cli(main)
