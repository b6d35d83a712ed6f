"""Draw a detector's detections on images with mmdet's own inference and
visualizer.

    .venv/bin/python demo/vis_detections.py CONFIG CHECKPOINT IMAGE_OR_DIR
        [--out-dir DIR] [--score-thr 0.3] [--device cpu]
        [--cfg-options k=v ...]

IMAGE_OR_DIR: one image, or a folder whose images (not its subfolders) are all
drawn. Writes OUT_DIR/<image name>.png (default work_dirs/vis_detections/) and
prints each path. Class names come from the checkpoint's meta (mmdet's
init_detector reads them), or from the config's test dataset metainfo when the
checkpoint has none. Only predictions with a score above --score-thr are drawn;
the config's model.test_cfg.score_thr filters first.
"""
import argparse
import copy
import os
import os.path as osp
import sys

sys.path[1:1] = [
    osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', sub)
    for sub in ('', 'env')
]
from env_check import require_env, run_cli  # noqa: E402

require_env()

import mmcv  # noqa: E402
import torch  # noqa: E402
from config_runner import load_config  # noqa: E402
from mmdet.apis import inference_detector, init_detector  # noqa: E402
from mmdet.registry import DATASETS, VISUALIZERS  # noqa: E402
from mmdet.utils.misc import IMG_EXTENSIONS  # noqa: E402
from mmengine.config import DictAction  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='detector config file')
    parser.add_argument(
        'checkpoint',
        help='checkpoint file (a state_dict with meta.dataset_meta)')
    parser.add_argument(
        'images',
        metavar='IMAGE_OR_DIR',
        help='an image file or a folder of images')
    parser.add_argument(
        '--out-dir',
        default=osp.join('work_dirs', 'vis_detections'),
        help='folder the drawn PNGs go to')
    parser.add_argument(
        '--score-thr',
        type=float,
        default=0.3,
        help='draw predictions with a higher score')
    parser.add_argument(
        '--device', default='cpu', help='cpu, cuda, cuda:0, ...')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value')
    return parser.parse_args()


def list_images(path):
    """The image files to draw: ``path`` itself, or the images directly inside
    the folder."""
    if osp.isfile(path):
        return [path]
    if osp.isdir(path):
        images = sorted(
            osp.join(path, name) for name in os.listdir(path)
            if name.lower().endswith(IMG_EXTENSIONS)
            and osp.isfile(osp.join(path, name)))
        if not images:
            raise SystemExit(
                f'aa_det: no images ({", ".join(IMG_EXTENSIONS)}) in the '
                f'folder {path}')
        return images
    raise SystemExit(f'aa_det: image file or folder not found: {path}')


def checkpoint_has_classes(path):
    """Whether the checkpoint's meta names its classes (what init_detector
    looks for).

    mmap keeps this cheap: tensors are not read. Also turns an unreadable file
    into one line."""
    try:
        try:
            ckpt = torch.load(path, map_location='cpu', mmap=True)
        except RuntimeError as e:
            if 'mmap' not in str(e):
                raise
            # legacy (non-zip) format
            ckpt = torch.load(path, map_location='cpu')
    except Exception as e:  # noqa: BLE001  anything torch.load rejects
        first = next(
            (line
             for line in str(e).splitlines() if 'Unsupported global' in line),
            str(e).splitlines()[0] if str(e) else '')
        hint = ((
            '; if you trust the file: python tools/convert_checkpoint.py IN '
            'OUT' if 'Unsupported global' in str(e) else ''))
        raise SystemExit(
            f'aa_det: cannot read checkpoint {path} ({type(e).__name__}: '
            f'{first.strip()}){hint}') from None
    meta = ckpt.get('meta') if isinstance(ckpt, dict) else None
    if not isinstance(meta, dict):
        return False
    dataset_meta = meta.get('dataset_meta') or {}
    return any(k.lower() == 'classes'
               for k in dataset_meta) or 'CLASSES' in meta


def config_classes(cfg):
    """Class names of the config's test dataset (its metainfo, else the dataset
    type's)."""
    dataset_cfg = copy.deepcopy(cfg.test_dataloader.dataset)
    # metainfo only: no annotation file is read
    dataset_cfg['lazy_init'] = True
    return tuple(DATASETS.build(dataset_cfg).metainfo.get('classes') or ())


def predicted_classes(model):
    """How many classes the detector's head predicts, when it says."""
    for head in (getattr(model, 'bbox_head', None),
                 getattr(getattr(model, 'roi_head', None), 'bbox_head', None)):
        if head is not None and isinstance(
                getattr(head, 'num_classes', None), int):
            return head.num_classes
    return None


def main():
    args = parse_args()
    if not osp.isfile(args.checkpoint):
        raise SystemExit(
            f'aa_det: checkpoint file not found: {args.checkpoint}')
    images = list_images(args.images)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        raise SystemExit(
            f'aa_det: --device {args.device}: CUDA is not available here; use '
            f'--device cpu')
    cfg = load_config(args.config, cfg_options=args.cfg_options)

    has_classes = checkpoint_has_classes(args.checkpoint)
    model = init_detector(cfg, args.checkpoint, device=args.device)
    source = f'the meta of {args.checkpoint}'
    if not has_classes:
        source = f'{args.config} (test_dataloader.dataset metainfo)'
        model.dataset_meta['classes'] = config_classes(cfg)
        print(
            f'aa_det: {args.checkpoint} has no class names in its meta; using '
            f'those of {source}: {", ".join(model.dataset_meta["classes"])}',
            file=sys.stderr)
    num_classes = predicted_classes(model)
    if num_classes is not None and len(
            model.dataset_meta['classes']) < num_classes:
        raise SystemExit(
            f'aa_det: {len(model.dataset_meta["classes"])} class names in '
            f'{source}, but the model of {args.config} predicts {num_classes} '
            f'classes')

    vis_cfg = copy.deepcopy(
        cfg.get('visualizer') or dict(type='DetLocalVisualizer'))
    # out_file only
    vis_cfg.update(
        name='aa_det_vis_detections', vis_backends=None, save_dir=None)
    visualizer = VISUALIZERS.build(vis_cfg)
    visualizer.dataset_meta = model.dataset_meta

    os.makedirs(args.out_dir, exist_ok=True)
    used = set()
    for path in images:
        name = osp.splitext(osp.basename(path))[0] + '.png'
        if name in used:  # a.jpg and a.png in one folder
            name = osp.basename(path) + '.png'
        used.add(name)
        out_file = osp.join(args.out_dir, name)
        if osp.abspath(out_file) == osp.abspath(path):
            raise SystemExit(
                f'aa_det: --out-dir {args.out_dir} would overwrite the input '
                f'image {path}; choose another --out-dir')
        try:
            image = mmcv.imread(path, channel_order='rgb')
        except Exception:  # noqa: BLE001  cv2 raises on some undecodable files
            image = None
        if image is None:
            raise SystemExit(f'aa_det: cannot decode the image {path}')
        result = inference_detector(model, path)
        visualizer.add_datasample(
            osp.basename(path),
            image,
            data_sample=result,
            draw_gt=False,
            pred_score_thr=args.score_thr,
            out_file=out_file)
        kept = int((result.pred_instances.scores > args.score_thr).sum())
        print(f'{out_file}: {kept} detections with score > {args.score_thr}')


if __name__ == '__main__':
    run_cli(main)
