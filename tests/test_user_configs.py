"""A user's own config on mmdet's bases, as the README tells it, through
mmdet's own ``tools/train.py`` and ``tools/test.py`` and mmdet's inference
APIs.

* The README's swap snippets (from scratch, from our ImageNet checkpoint),
  exactly as written there, on mmdet's ``retinanet_r50_fpn_1x_coco.py`` and
  ``faster-rcnn_r50_fpn_1x_coco.py``, train what they say: every backbone
  BatchNorm trains from scratch; the checkpoint loads every weight.
* The one-line swap of ``type`` alone (mmdet's ``frozen_stages=1``,
  ``norm_eval=True`` kept) from scratch is refused before the first iteration
  with ``RunChecksHook``, warned without it, and neither with a whole-detector
  ``load_from``; a ResNet checkpoint in an AA-ResNet is a warning naming the
  attention weights it left.
* The checkpoints load through ``init_detector``, ``inference_detector``,
  ``DetInferencer``, mmdet's ``tools/test.py`` and ``--resume`` under torch's
  safe loading, with nothing allowed.
* ``RunChecksHook`` (the snippets' ``custom_hooks``) gives such a config our
  checks, each at its own priority: a wrong ``num_classes`` is refused before
  training.

Each config trains one epoch of 2 iterations on the tiny shapes set at 96 px
(the data lines are the test's, appended to the user's config).
"""
import glob
import os
import os.path as osp
import re

import mmdet
import pytest
import torch
from demo_config import ROOT
from tool_output import own_stderr
from tool_process import run_python

MMDET_TOOLS = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools')
ENV = dict(os.environ, OMP_NUM_THREADS='1')
RETINANET = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
FASTER_RCNN = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
NUM_CLASSES = {
    RETINANET: 'model.bbox_head.num_classes',
    FASTER_RCNN: 'model.roi_head.bbox_head.num_classes'
}
#: the test's data, appended to the user's config: the tiny shapes set, one
#: epoch, no validation
DATA = '''
data_root = {root!r}
metainfo = dict(classes=('circle', 'square', 'triangle'))
pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True),
            dict(type='Resize', scale=(96, 96), keep_ratio=True), dict(type='PackDetInputs')]
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False, dataset=dict(
    data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_train.json',
    data_prefix=dict(img='train/'), pipeline=pipeline))
val_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False, dataset=dict(
    data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_val.json',
    data_prefix=dict(img='val/'), pipeline=pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=100)
'''  # noqa: E501


def readme_snippet(name: str) -> str:
    """The README's Python block after ``<!-- swap: name -->``."""
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        text = f.read()
    match = re.search(rf'<!-- swap: {name} -->\s*```python\n(.*?)```', text,
                      re.DOTALL)
    assert match, f'README.md has no swap snippet {name!r}'
    return match.group(1)


def user_config(tmp_path,
                text: str,
                base: str,
                data_root,
                name: str = 'user_config.py') -> str:
    """``text`` (a README snippet) on ``base`` instead of RetinaNet's, plus the
    test's data lines."""
    path = tmp_path / name
    path.write_text(
        text.replace(RETINANET, base) +
        DATA.format(root=str(data_root).rstrip('/') + '/'))
    return str(path)


def mmdet_tool(script: str, *args, cwd=ROOT, options=None):
    """mmdet's own ``tools/<script>`` on ``args`` (with ``--cfg-options``
    ``options``)."""
    cmd = [osp.join(MMDET_TOOLS, script), *map(str, args)]
    if options:
        cmd += ['--cfg-options'] + [f'{k}={v}' for k, v in options.items()]
    return run_python(cmd, env=ENV, cwd=cwd)


def train(config: str, base: str, work_dir, *args, cwd=ROOT, **options):
    """mmdet's ``tools/train.py`` on ``config`` with ``base``'s head set to the
    3 classes; (result, its stderr)."""
    out = mmdet_tool(
        'train.py',
        config,
        '--work-dir',
        work_dir,
        *args,
        cwd=cwd,
        options={
            NUM_CLASSES[base]: 3,
            **options
        })
    return out, own_stderr(out.stderr)


def assert_refused(out, stderr: str, pattern: str):
    """mmdet's tool: a traceback that ends in our one line."""
    assert out.returncode == 1 and 'Traceback' in stderr, stderr[-3000:]
    assert re.fullmatch(rf'aa_det\.\S*Error: {pattern}',
                        stderr.rstrip('\n').splitlines()[-1]), stderr[-3000:]


def safe_load(path):
    """The checkpoint through torch's safe unpickler, nothing allowed
    (``weights_only`` from torch 2.4 on)."""
    return torch.load(path, map_location='cpu', weights_only=True)


def backbone_norms_trained(checkpoint: dict) -> bool:
    """Every BatchNorm of the backbone updated its statistics in training."""
    tracked = {
        k: int(v)
        for k, v in checkpoint['state_dict'].items()
        if k.startswith('backbone.') and k.endswith('num_batches_tracked')
    }
    return bool(tracked) and min(tracked.values()) > 0


@pytest.mark.slow
def test_scratch_snippet_trains_every_layer_its_checkpoint_loads_everywhere(
        tiny_shapes, tmp_path):
    """The README's from-scratch snippet on mmdet's RetinaNet config; its
    checkpoint through mmdet's inference APIs, mmdet's tools/test.py and
    --resume."""
    config = user_config(tmp_path, readme_snippet('scratch'), RETINANET,
                         tiny_shapes)
    work = tmp_path / 'work'
    out, stderr = train(config, RETINANET, work)
    assert out.returncode == 0, stderr[-3000:]
    ckpt = str(work / 'epoch_1.pth')
    # before: running mean 0, variance 1, frozen stem
    assert backbone_norms_trained(safe_load(ckpt))

    from mmdet.apis import DetInferencer, inference_detector, init_detector
    image = str(tiny_shapes / 'val' / '000000.png')
    model = init_detector(
        config, ckpt, device='cpu', cfg_options={NUM_CLASSES[RETINANET]: 3})
    assert model.dataset_meta['classes'] == ('circle', 'square', 'triangle')
    assert torch.isfinite(
        inference_detector(model, image).pred_instances.bboxes).all()
    inferencer = DetInferencer(
        model=config, weights=ckpt, device='cpu', show_progress=False)
    assert len(inferencer(image, return_vis=False)['predictions']) == 1

    out = mmdet_tool(
        'test.py',
        config,
        ckpt,
        '--work-dir',
        tmp_path / 'test',
        options={
            NUM_CLASSES[RETINANET]: 3,
            'model.test_cfg.score_thr': 0.0
        })
    assert (out.returncode == 0
            and 'coco/bbox_mAP' in out.stdout + out.stderr), out.stderr[-3000:]

    out, stderr = train(config, RETINANET, work, '--resume',
                        **{'train_cfg.max_epochs': 2})
    assert (out.returncode == 0
            and 'resumed epoch: 1' in stderr + out.stdout), stderr[-3000:]
    assert osp.isfile(work / 'epoch_2.pth')


@pytest.mark.slow
@pytest.mark.parametrize('base', [FASTER_RCNN])
def test_scratch_snippet_in_another_detector(base, tiny_shapes, tmp_path):
    out, stderr = train(
        user_config(tmp_path, readme_snippet('scratch'), base, tiny_shapes),
        base, tmp_path / 'work')
    assert out.returncode == 0, stderr[-3000:]
    assert backbone_norms_trained(
        safe_load(str(tmp_path / 'work' / 'epoch_1.pth')))


ONE_LINE_SWAP = f'''_base_ = {RETINANET!r}
custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
model = dict(backbone=dict(type='AAResNet', init_cfg=None))
'''

RUN_CHECKS = "custom_hooks = [dict(type='RunChecksHook')]\n"


def test_one_line_swap_from_scratch_is_refused_before_training_by_run_checks(
        tiny_shapes, tmp_path):
    """mmdet's frozen_stages=1 and norm_eval=True, nothing loaded, with the
    README's ``RunChecksHook``: one line before the first iteration (the stem
    and stage 1 would stay random, every BatchNorm at mean 0, variance 1)."""
    config = user_config(tmp_path, ONE_LINE_SWAP + RUN_CHECKS, RETINANET,
                         tiny_shapes)
    out, stderr = train(config, RETINANET, tmp_path / 'work')
    assert_refused(
        out, stderr,
        r'model.backbone \(AAResNet\): frozen_stages=1, norm_eval=True freeze '
        r'\d+ tensors \(0.\d\dM parameters\) at their random initialisation: '
        r'no init_cfg Pretrained, load_from or resume loaded them \(first: '
        r'conv1.weight; .*')
    assert 'Epoch(train)' not in stderr and not glob.glob(
        str(tmp_path / 'work' / '*.pth'))


@pytest.mark.slow
def test_one_line_swap_from_scratch_without_our_hooks_is_warned(
        tiny_shapes, tmp_path):
    """The same swap without ``RunChecksHook``: the backbone's ``train()`` does
    not raise; one warning before the first iteration names what stays
    random."""
    out, stderr = train(
        user_config(tmp_path, ONE_LINE_SWAP, RETINANET, tiny_shapes),
        RETINANET, tmp_path / 'work')
    assert out.returncode == 0, stderr[-3000:]
    warnings = re.findall(
        r'WARNING - aa_det: model.backbone \(AAResNet\): frozen_stages=1, '
        r'norm_eval=True freeze \d+ tensors .*', out.stdout)
    assert len(warnings) == 1 and out.stdout.index(
        warnings[0]) < out.stdout.index('Epoch(train)'), out.stdout[-3000:]


@pytest.mark.slow
def test_one_line_swap_with_a_whole_detector_load_from_trains(
        tiny_shapes, tmp_path):
    """load_from fills what init_cfg left: nothing to refuse."""
    first = user_config(tmp_path, readme_snippet('scratch'), RETINANET,
                        tiny_shapes, 'scratch.py')
    out, stderr = train(first, RETINANET, tmp_path / 'first')
    assert out.returncode == 0, stderr[-3000:]
    config = user_config(
        tmp_path, ONE_LINE_SWAP +
        f"load_from = {str(tmp_path / 'first' / 'epoch_1.pth')!r}\n",
        RETINANET, tiny_shapes)
    out, stderr = train(config, RETINANET, tmp_path / 'work')
    assert out.returncode == 0 and 'aa_det' not in stderr, stderr[-3000:]


def fake_imagenet_checkpoint(path, backbone: dict, prefix: str = ''):
    """A checkpoint of ``backbone``'s keys and shapes (freshly initialised
    values: what a load fills is told by the keys it brings, not by the
    values)."""
    from mmdet.registry import MODELS

    import aa_det  # noqa: F401
    model = MODELS.build(backbone)
    model.init_weights()
    os.makedirs(osp.dirname(path), exist_ok=True)
    torch.save(
        dict(
            state_dict={prefix + k: v
                        for k, v in model.state_dict().items()},
            meta=dict()), path)


@pytest.mark.slow
@pytest.mark.parametrize('base', [RETINANET, FASTER_RCNN])
def test_pretrained_snippet_loads_every_weight(base, tiny_shapes, tmp_path):
    """The README's snippet with our ImageNet checkpoint (mmpretrain's keys:
    ``backbone.``), at its path."""
    snippet = readme_snippet('pretrained')
    path = re.search(r"checkpoint='([^']+)'", snippet).group(1)
    fake_imagenet_checkpoint(
        str(tmp_path / path),
        dict(type='AAResNet', depth=50),
        prefix='backbone.')
    out, stderr = train(
        user_config(tmp_path, snippet, base, tiny_shapes),
        base,
        tmp_path / 'work',
        cwd=tmp_path)
    assert out.returncode == 0 and 'aa_det' not in stderr, stderr[-3000:]


@pytest.mark.slow
def test_resnet_checkpoint_in_aa_resnet_names_what_it_left(
        tiny_shapes, tmp_path):
    """A ResNet-50 checkpoint in AA-ResNet-50 (mmdet's config, type changed): a
    warning names the attention weights; stem and stage 1 load, so
    frozen_stages=1 and norm_eval train what the config says."""
    resnet = tmp_path / 'resnet50.pth'
    fake_imagenet_checkpoint(str(resnet), dict(type='ResNet', depth=50))
    config = user_config(
        tmp_path,
        ONE_LINE_SWAP.replace(
            'init_cfg=None',
            f"init_cfg=dict(type='Pretrained', checkpoint={str(resnet)!r})"),
        RETINANET, tiny_shapes)
    out, stderr = train(config, RETINANET, tmp_path / 'work')
    assert out.returncode == 0, stderr[-3000:]
    warning = re.search(
        r'aa_det: model.backbone \(AAResNet\): init_cfg Pretrained \S+ left '
        r'(\d+) tensors \(\d+.\d\dM of 23.79M parameters\) at their '
        r'initialisation, to be trained from scratch: (.*)', out.stdout)
    assert warning and 'qkv.weight' in warning.group(2), out.stdout[-3000:]


def test_run_checks_hook_refuses_wrong_num_classes_in_a_users_config(
        tiny_shapes, tmp_path):
    """The README's snippet (``RunChecksHook``) on mmdet's bases with mmdet's
    80 classes on 3-class data: before, it trained to the end."""
    config = user_config(tmp_path, readme_snippet('scratch'), RETINANET,
                         tiny_shapes)
    # num_classes: mmdet's 80
    out = mmdet_tool('train.py', config, '--work-dir', tmp_path / 'work')
    assert_refused(
        out, own_stderr(out.stderr),
        r'train_dataloader.dataset: The `num_classes` \(80\) in RetinaHead of '
        r'RetinaNet does not matches the length of `classes` 3\) in '
        r'CocoDataset; .*')
    assert not glob.glob(str(tmp_path / 'work' / '*.pth'))


def test_run_checks_hook_runs_each_check_at_its_own_priority(tmp_path):
    """``RunChecksHook`` puts each of its hooks into the Runner at the hook's
    priority: the checkpoint is written with safe types after every other hook
    has added to it (here one that adds a numpy value, as a user's hook may),
    so torch's safe loading reads it; a second ``before_run`` adds nothing."""
    import numpy as np
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel
    from mmengine.runner import Runner, get_priority

    import aa_det  # noqa: F401

    class Toy(BaseModel):

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, *args, mode='tensor', **kwargs):
            return self.weight

    class AddsNumpy(Hook):

        def before_save_checkpoint(self, runner, checkpoint):
            checkpoint['meta']['scale'] = np.float64(0.5)

    runner = Runner(
        model=Toy(),
        work_dir=str(tmp_path),
        default_scope='mmdet',
        custom_hooks=[dict(type='RunChecksHook'),
                      AddsNumpy()])
    runner.call_hook('before_run')
    runner.call_hook('before_run')
    names = [type(hook).__name__ for hook in runner.hooks]
    assert names.count(
        'SafeCheckpointHook') == 1 and names[-1] == 'SafeCheckpointHook', names
    assert {
        'CheckpointCheckHook', 'EarlyNumClassCheckHook', 'DatasetCheckHook',
        'StopOnNonFiniteLoss', 'StopOnNonFiniteOutputs', 'HeadNormCheckHook'
    } <= set(names)
    priorities = [get_priority(hook.priority) for hook in runner.hooks]
    assert priorities == sorted(priorities), list(zip(names, priorities))
    checkpoint = dict(
        meta=dict(),
        state_dict=runner.model.state_dict(),
        message_hub=runner.message_hub.state_dict())
    runner.call_hook('before_save_checkpoint', checkpoint=checkpoint)
    torch.save(checkpoint, tmp_path / 'checkpoint.pth')
    assert safe_load(tmp_path / 'checkpoint.pth')['meta']['scale'] == 0.5
