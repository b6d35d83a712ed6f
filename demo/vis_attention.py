"""Draw per-head attention maps of chosen pixels over an image (AA paper Figs.
10-11).

AA layers: one PNG grid, rows = heads, columns = query positions. GSA layers:
content and positional maps (rows = heads, columns = position x {content,
positional}).

    .venv/bin/python demo/vis_attention.py CONFIG CHECKPOINT \\
        --layer layer3.0.conv2 --positions 40,60 100,150 --out attention.png \\
        [--image IMG]

CONFIG is a detection or classification config, CHECKPOINT a checkpoint of it
(the demo detector's work_dirs/demo_shapes/epoch_12.pth, say); the maps are of
its backbone. Without --image, a generated shapes scene is used. The maps come
from ``demo/attention_maps.py``, a path of their own: the layers' forward is
not changed or slowed by it.
"""
import argparse
import os.path as osp
import sys

sys.path[1:1] = [
    osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', sub)
    for sub in ('', 'env')
]
from env_check import require_env, run_cli  # noqa: E402

require_env()

import matplotlib  # noqa: E402

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from attention_maps import attention_weights  # noqa: E402
from config_runner import load_config  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402
from mmengine.model import revert_sync_batchnorm  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402
from PIL import Image  # noqa: E402

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d  # noqa: E402
from aa_det.utils import ConfigError  # noqa: E402

MEAN, STD = np.array([123.675, 116.28,
                      103.53]), np.array([58.395, 57.12, 57.375])


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='detection or classification config')
    parser.add_argument('checkpoint', help='a checkpoint of that model')
    parser.add_argument(
        '--layer',
        default='layer3.0.conv2',
        help='module name of an AA conv / GSA module')
    parser.add_argument(
        '--image', help='image file; default: a generated shapes scene')
    parser.add_argument(
        '--size',
        type=int,
        default=224,
        help='short side the image is resized to')
    parser.add_argument(
        '--positions',
        nargs='+',
        default=['0.3,0.3', '0.5,0.5', '0.7,0.6'],
        help='query pixels as row,col: integers are pixels (40,60), decimals '
        'are fractions (0.3,0.5)')
    parser.add_argument('--out', default='attention.png')
    return parser.parse_args()


def load_image(path, size):
    if path is None:
        from synthetic_shapes import _scene
        image, _ = _scene(np.random.default_rng(0), size, 4, size)
    else:
        if not osp.isfile(path):
            raise SystemExit(f'aa_det: --image not found: {path}')
        image = Image.open(path).convert('RGB')
        scale = size / min(image.size)
        image = image.resize(
            (round(image.width * scale), round(image.height * scale)))
    return np.asarray(image)


def parse_positions(specs, height, width):
    out = []
    for spec in specs:
        try:
            r, c = (float(v) for v in spec.split(','))
        except ValueError:
            raise SystemExit(
                f'aa_det: --positions expects row,col pairs, got {spec!r}'
            ) from None
        r, c = (r * (height - 1), c * (width - 1)) if '.' in spec else (r, c)
        if not (0 <= r < height and 0 <= c < width):
            raise SystemExit(
                f'aa_det: --positions {spec} is outside the {height}x{width} '
                f'image')
        out.append((r, c))
    return out


def main():
    args = parse_args()
    cfg = load_config(args.config)
    if not osp.isfile(args.checkpoint):
        raise ConfigError(f'checkpoint file not found: {args.checkpoint}')
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    # a single process: BN for the config's SyncBN
    model = revert_sync_batchnorm(MODELS.build(cfg.model))
    load_checkpoint(
        model, args.checkpoint, map_location='cpu', logger='silent')
    backbone = model.backbone
    backbone.eval()
    layer = dict(backbone.named_modules()).get(args.layer)
    if not isinstance(layer, (AAConv2d, GlobalSelfAttention2d)):
        names = [
            n for n, m in backbone.named_modules()
            if isinstance(m, (AAConv2d, GlobalSelfAttention2d))
        ]
        raise SystemExit(
            f'aa_det: --layer {args.layer!r} is not an attention layer; '
            f'choose from e.g. {names[:3]} ... {names[-1:]}')
    image = load_image(args.image, args.size)
    H, W = image.shape[:2]
    positions = parse_positions(args.positions, H, W)
    captured = {}
    handle = layer.register_forward_pre_hook(
        lambda m, inputs: captured.setdefault('x', inputs[0]))
    x = torch.from_numpy(((image - MEAN) / STD).transpose(2, 0,
                                                          1)).float()[None]
    with torch.no_grad():
        backbone(x)
        handle.remove()
        feat = captured['x']
        if isinstance(layer, AAConv2d):
            grid = layer.attention_input(feat).shape[-2:]
        else:
            grid = feat.shape[-2:]
        queries = torch.tensor([[
            min(int(r * grid[0] / H), grid[0] - 1),
            min(int(c * grid[1] / W), grid[1] - 1)
        ] for r, c in positions])
        # name -> [1, Nh, P, h, w]
        maps = attention_weights(layer, feat, queries)
    kinds = list(maps)
    heads = next(iter(maps.values())).shape[1]
    cols = len(positions) * len(kinds)
    fig, axes = plt.subplots(
        heads, cols, figsize=(2.2 * cols, 2.2 * heads), squeeze=False)
    for p, (r, c) in enumerate(positions):
        for kind_idx, kind in enumerate(kinds):
            col = p * len(kinds) + kind_idx
            for head in range(heads):
                m = F.interpolate(
                    maps[kind][0, head, p][None, None].float(),
                    size=(H, W),
                    mode='nearest')[0, 0]
                ax = axes[head, col]
                ax.imshow(image)
                ax.imshow(m.numpy(), cmap='jet', alpha=0.55)
                ax.plot(c, r, 'w*', markersize=10, markeredgecolor='k')
                ax.set_xticks([])
                ax.set_yticks([])
                if head == 0:
                    ax.set_title(f'({int(r)},{int(c)}) {kind}', fontsize=8)
                if col == 0:
                    ax.set_ylabel(f'head {head}', fontsize=8)
    fig.suptitle(
        f'{type(backbone).__name__} {args.layer} '
        f'({osp.basename(args.checkpoint)})',
        fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f'wrote {args.out}: {heads} heads x {len(positions)} positions '
          f'({", ".join(kinds)})')


if __name__ == '__main__':
    run_cli(main)
