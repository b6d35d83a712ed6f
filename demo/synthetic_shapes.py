"""A small generated COCO-format detection dataset (no download): the demo's
data.

Scenes of filled circles, squares and triangles of random size, colour and
position on a textured background; boxes are exact (the shapes' extents).

From the command line (a checkout's demo/ or an installed package's
``aa_det/.mim/demo/``), the data the demo configs read, under the current
directory:

    python synthetic_shapes.py           # data/shapes/ (the detection demo's)
    python synthetic_shapes.py --cls     # data/shapes_cls/ (the classifier's)

Example:
    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> paths = generate_shapes_coco(root, num_train=4, num_val=2,
    ...                              image_size=64)
    >>> sorted(paths)
    ['train', 'val']
"""
import json
import os
import os.path as osp
import shutil
import zlib
from typing import Dict, Iterable, Optional, Sequence

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ('circle', 'square', 'triangle')


def _scene(rng: np.random.Generator, size: int, max_objects: int,
           object_scale: int):
    """One image (H, W, 3 uint8) and its [(x, y, w, h, class_index)] boxes;
    object sides are drawn from ``[object_scale // 8, object_scale // 3)``."""
    image = _background(rng, size)
    draw = ImageDraw.Draw(image)
    boxes = []
    for _ in range(rng.integers(1, max_objects + 1)):
        cls = int(rng.integers(len(CLASSES)))
        side = int(rng.integers(object_scale // 8, object_scale // 3))
        x0, y0 = (int(v) for v in rng.integers(0, size - side, size=2))
        x1, y1 = x0 + side, y0 + side
        if any(x0 < bx + bw and bx < x1 and y0 < by + bh and by < y1
               for bx, by, bw, bh, _ in boxes):
            continue  # no occlusion: every box shows its whole shape
        _draw_shape(draw, cls, (x0, y0, x1, y1),
                    tuple(int(c) for c in rng.integers(150, 256, size=3)))
        boxes.append((x0, y0, side, side, cls))
    return image, boxes


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    base = rng.integers(40, 120, size=3)
    noise = rng.normal(0, 12, size=(size, size, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _draw_shape(draw: ImageDraw.ImageDraw, cls: int, box, colour):
    """Fill shape ``CLASSES[cls]`` exactly inside ``box = (x0, y0, x1, y1)``
    (x1, y1 exclusive)."""
    x0, y0, x1, y1 = box
    if cls == 0:
        draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=colour)
    elif cls == 1:
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=colour)
    else:
        draw.polygon([(x0, y1 - 1), (x1 - 1, y1 - 1), ((x0 + x1 - 1) / 2, y0)],
                     fill=colour)


def generate_shapes_coco(root: str,
                         num_train: int = 400,
                         num_val: int = 100,
                         image_size: int = 128,
                         max_objects: int = 4,
                         seed: int = 0) -> Dict[str, str]:
    """Write ``root/{train,val}/*.png`` and
    ``root/annotations/instances_{train,val}.json``.

    Existing files are reused when the annotation file records the same
    settings.

    Returns:
        dict: split name -> annotation file path.
    """
    return {
        split: generate_shapes_split(
            root, split, count, image_size, max_objects=max_objects, seed=seed)
        for split, count in (('train', num_train), ('val', num_val))
    }


def generate_shapes_split(root: str,
                          split: str,
                          num_images: int,
                          image_size: int = 128,
                          object_scale: Optional[int] = None,
                          max_objects: int = 4,
                          seed: int = 0) -> str:
    """Write one split: ``root/<split>/*.png`` and
    ``root/annotations/instances_<split>.json``.

    Args:
        object_scale (int, optional): the image size whose object sizes to draw
            (sides in ``[object_scale // 8, object_scale // 3)``). Larger
            images at the training images' object scale test a detector beyond
            its training crops. Defaults to ``image_size``.
        max_objects (int): objects tried per image (at most; overlapping ones
            are dropped).

    Returns:
        str: the annotation file; reused when it records the same settings.
    """
    object_scale = object_scale or image_size
    settings = dict(
        num_images=num_images,
        image_size=image_size,
        max_objects=max_objects,
        seed=seed)
    if object_scale != image_size:
        settings['object_scale'] = object_scale
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    ann_file = osp.join(root, 'annotations', f'instances_{split}.json')
    if osp.exists(ann_file):
        with open(ann_file) as f:
            if json.load(f).get('info', {}).get('settings') == settings:
                return ann_file
    stream = {'train': 0, 'val': 1}.get(split, zlib.crc32(split.encode()))
    rng = np.random.default_rng([seed, stream])
    scenes = (
        _scene(rng, image_size, max_objects, object_scale)
        for _ in range(num_images))
    return write_coco_split(
        root, split, ((image, [(cls, [x, y, w, h])
                               for x, y, w, h, cls in boxes])
                      for image, boxes in scenes), CLASSES,
        dict(description='aa_det synthetic shapes', settings=settings))


def write_coco_split(root: str, split: str, scenes: Iterable,
                     classes: Sequence[str], info: dict) -> str:
    """Save generated ``scenes``
    (``(PIL image, [(class index, [x, y, w, h]), ...])``) as
    ``root/<split>/<id>.png`` and their COCO file
    ``root/annotations/instances_<split>.json``.

    Returns:
        str: the annotation file.
    """
    os.makedirs(osp.join(root, split), exist_ok=True)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    images, annotations = [], []
    for image_id, (image, boxes) in enumerate(scenes):
        name = f'{image_id:06d}.png'
        image.save(osp.join(root, split, name))
        images.append(
            dict(
                id=image_id,
                file_name=name,
                width=image.width,
                height=image.height))
        for cls, box in boxes:
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    category_id=cls + 1,
                    bbox=box,
                    area=box[2] * box[3],
                    iscrowd=0))
    coco = dict(
        info=info,
        images=images,
        annotations=annotations,
        categories=[dict(id=i + 1, name=n) for i, n in enumerate(classes)])
    ann_file = osp.join(root, 'annotations', f'instances_{split}.json')
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    return ann_file


def generate_shapes_folder(root: str,
                           num_per_class: int = 120,
                           num_val_per_class: int = 40,
                           image_size: int = 64,
                           seed: int = 0) -> Dict[str, str]:
    """Write a folder-layout classification set:
    ``root/{train,val}/<shape>/*.png``.

    One shape per image, random size, position and colour; the class is the
    shape. Existing folders with the same settings (``root/settings.json``) are
    reused.

    Returns:
        dict: split name -> folder.
    """
    settings = dict(
        num_per_class=num_per_class,
        num_val_per_class=num_val_per_class,
        image_size=image_size,
        seed=seed)
    marker = osp.join(root, 'settings.json')
    paths = {split: osp.join(root, split) for split in ('train', 'val')}
    if osp.exists(marker):
        with open(marker) as f:
            if json.load(f) == settings:
                return paths
    # other settings: start afresh, no stale images
    for split in paths.values():
        shutil.rmtree(split, ignore_errors=True)
    for split, count in (('train', num_per_class), ('val', num_val_per_class)):
        rng = np.random.default_rng([seed, 2 if split == 'train' else 3])
        for cls, name in enumerate(CLASSES):
            folder = osp.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                image = _background(rng, image_size)
                side = int(rng.integers(image_size // 4, image_size // 2))
                x0, y0 = (
                    int(v) for v in rng.integers(0, image_size - side, size=2))
                colour = tuple(int(c) for c in rng.integers(150, 256, size=3))
                _draw_shape(
                    ImageDraw.Draw(image), cls, (x0, y0, x0 + side, y0 + side),
                    colour)
                image.save(osp.join(folder, f'{i:05d}.png'))
    with open(marker, 'w') as f:
        json.dump(settings, f)
    return paths


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(
        description="Write the demo configs' generated shapes data set")
    parser.add_argument(
        'root',
        nargs='?',
        help='where (default: data/shapes, '
        'or data/shapes_cls with --cls)')
    parser.add_argument(
        '--cls',
        action='store_true',
        help="the classification demo's folder layout")
    args = parser.parse_args(argv)
    if args.cls:
        root = args.root or osp.join('data', 'shapes_cls')
        paths = generate_shapes_folder(root)
    else:
        paths = generate_shapes_coco(args.root or osp.join('data', 'shapes'))
    for split, path in paths.items():
        print(f'{split}: {path}')


if __name__ == '__main__':
    main()
