"""The demo detection config and the ``--cfg-options`` that point it at a
generated shapes dataset, shared by the tests that train or evaluate it."""
import os.path as osp

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(
    ROOT,
    'configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py')


def demo_options(root, **extra):
    """``--cfg-options`` pointing the demo config at a generated shapes dataset
    under ``root`` (no DataLoader workers), updated with ``extra``."""
    root = str(root).rstrip('/') + '/'
    options = {
        f'{s}_dataloader.dataset.data_root': root
        for s in ('train', 'val', 'test')
    }
    options.update({
        f'{s}_evaluator.ann_file': root + 'annotations/instances_val.json'
        for s in ('val', 'test')
    })
    options.update({
        f'{s}_dataloader.{k}': v
        for s in ('train', 'val', 'test')
        for k, v in (('num_workers', 0), ('persistent_workers', False))
    })
    options.update(extra)
    return options
