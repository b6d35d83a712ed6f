"""Checkpoints checked before work is spent, and training stopped on a
non-finite loss: unreadable, non-finite or ill-fitting checkpoints are one
``aa_det:`` line naming the file; auto-resume falls back past a truncated
latest checkpoint."""
import glob
import os
import os.path as osp
import re
import zipfile

import pytest
import torch
from config_runner import build_runner, load_config
from demo_config import DEMO, ROOT, demo_options
from tool_output import own_stderr
from tool_process import run_python

from aa_det.engine import ConfigError, NonFiniteLossError, NonFiniteOutputError

ENV = dict(os.environ, OMP_NUM_THREADS='1')
# one iteration per epoch, no validation unless asked
ONE_ITER = {
    'train_cfg.max_epochs': 1,
    'train_dataloader.batch_size': 8,
    'train_cfg.val_interval': 100
}
RESNET18 = {
    'model.backbone':
    dict(
        _delete_=True,
        type='ResNet',
        depth=18,
        base_channels=32,
        norm_cfg=dict(type='BN'),
        norm_eval=False,
        init_cfg=None)
}


def config(tiny_shapes, work_dir, **extra):
    return load_config(
        DEMO,
        work_dir=str(work_dir),
        cfg_options=demo_options(tiny_shapes, **{
            **ONE_ITER,
            **extra
        }))


def save_weights(tiny_shapes, path, **extra):
    """A detector checkpoint (weights only) of the demo config with ``extra``
    options."""
    model = build_runner(config(tiny_shapes, osp.dirname(path), **extra)).model
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    return path


@pytest.fixture(scope='module')
def aa_ckpt(tiny_shapes, tmp_path_factory):
    return save_weights(tiny_shapes,
                        str(tmp_path_factory.mktemp('aa') / 'aa.pth'))


@pytest.fixture(scope='module')
def resnet_ckpt(tiny_shapes, tmp_path_factory):
    return save_weights(tiny_shapes,
                        str(tmp_path_factory.mktemp('r18') / 'resnet18.pth'),
                        **RESNET18)


def overwrite_bytes(src, dst, new_bytes):
    """Copy ``src`` with ``new_bytes`` written over the middle of its largest
    tensor (a damaged copy: the zip entry's CRC no longer matches)."""
    with zipfile.ZipFile(src) as archive:
        record = max(
            (info for info in archive.infolist() if '/data/' in info.filename),
            key=lambda i: i.file_size)
    data = bytearray(open(src, 'rb').read())
    name_len, extra_len = (
        int.from_bytes(
            data[record.header_offset + k:record.header_offset + k + 2],
            'little') for k in (26, 28))
    start = record.header_offset + 30 + name_len + extra_len + (
        record.file_size - len(new_bytes)) // 2 // 4 * 4
    data[start:start + len(new_bytes)] = new_bytes
    open(dst, 'wb').write(bytes(data))
    return dst, record.filename


def run_test_tool(tiny_shapes, checkpoint, work_dir, **extra):
    return run_python([
        osp.join(ROOT, 'tools/test.py'), DEMO, checkpoint, '--work-dir',
        work_dir, '--cfg-options',
        *[f'{k}={v}' for k, v in demo_options(tiny_shapes, **extra).items()]
    ],
                      env=ENV,
                      cwd=ROOT)


@pytest.mark.parametrize(
    'new_bytes',
    [b'\xff' * 8, torch.full((1024, ), 0.5).numpy().tobytes()],
    ids=['8 bytes of NaN', '4096 bytes of finite floats'])
def test_test_tool_fails_on_damaged_bytes(tiny_shapes, aa_ckpt, tmp_path,
                                          new_bytes):
    """Before: damage to NaN was named as non-finite values, and finite damage
    (4096 bytes overwritten) evaluated at mAP 0.029 instead of 0.565 without a
    word. Now the zip CRC names it."""
    bad, entry = overwrite_bytes(aa_ckpt, str(tmp_path / 'bad.pth'), new_bytes)
    out = run_test_tool(tiny_shapes, bad, tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert (own_stderr(out.stderr) == (
        f'aa_det: checkpoint file is damaged: {bad}: entry {entry} fails its '
        f'CRC check (a broken copy or disk? copy or save it again)\n')
            ), out.stderr[-2000:]


def edited_checkpoint(src, dst, key, value):
    """``src`` saved again as ``dst`` with ``state_dict[key]`` filled with
    ``value`` (CRCs right)."""
    state = torch.load(src)['state_dict']
    state[key].fill_(value)
    torch.save({'state_dict': state, 'meta': {}}, dst)
    return dst


def test_checkpoint_with_nan_weights_is_one_line(tiny_shapes, aa_ckpt,
                                                 tmp_path):
    """Before: tools/test.py exited 0 with empty results (NaN weights, no
    boxes)."""
    path = edited_checkpoint(aa_ckpt, str(tmp_path / 'nan.pth'),
                             'backbone.conv1.weight', float('nan'))
    out = run_test_tool(tiny_shapes, path, tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert re.fullmatch(
        r'aa_det: checkpoint holds non-finite values \(NaN or inf\): '
        r'\S+nan.pth: first at state_dict\.backbone\.conv1\.weight\n',
        own_stderr(out.stderr)), out.stderr[-2000:]


def test_non_finite_test_outputs_stop_the_test_tool(tiny_shapes, aa_ckpt,
                                                    tmp_path):
    """Finite weights whose features are not: a negative BatchNorm variance
    (NaN from its square root). Before: rc 0, no detections, every metric 0.
    Now one line naming the module."""
    path = edited_checkpoint(aa_ckpt, str(tmp_path / 'negative_var.pth'),
                             'backbone.layer3.0.bn1.running_var', -1.0)
    out = run_test_tool(tiny_shapes, path, tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert re.fullmatch(
        r'aa_det: testing stopped: non-finite outputs in 1 of 1 batches '
        r'\(first: backbone features, input 4x3x128x128, first at '
        r'backbone\.layer3\.0\.bn1\); the metrics would be meaningless\. '
        r'Causes: .*\n', own_stderr(out.stderr)), out.stderr[-2000:]


@pytest.mark.parametrize('content, message', [
    (b'', r'checkpoint file is empty \(0 bytes\): \S+ckpt.pth'),
    (b'\x80\x02garbage' * 50,
     r'checkpoint file cannot be loaded: \S+ckpt.pth: it is not a PyTorch '
     r'checkpoint'),
    (None,
     r'checkpoint file cannot be loaded: \S+ckpt.pth: it is truncated or '
     r'damaged'),
])
def test_unreadable_checkpoint_is_one_line(tiny_shapes, aa_ckpt, tmp_path,
                                           content, message):
    """Before: torch's advice to pass weights_only=False, a bare EOFError, a
    miniz error."""
    path = tmp_path / 'ckpt.pth'
    path.write_bytes(
        content if content is not None else open(aa_ckpt, 'rb').read()[:100000]
    )
    cfg = config(tiny_shapes, tmp_path)
    cfg.load_from = str(path)
    with pytest.raises(ConfigError, match=message) as error:
        build_runner(cfg, splits=('test', )).test()
    assert '\n' not in str(error.value) and 'weights_only' not in str(
        error.value)


def test_resnet_checkpoint_for_the_aa_config_is_an_error_unless_partial(
        tiny_shapes, resnet_ckpt, tmp_path):
    """Before: one warning among 490 lines, then a half-random model was
    evaluated."""
    # tools/test.py, and load_from in training
    for splits in (('test', ), ('train', 'val', 'test')):
        cfg = config(tiny_shapes, tmp_path)
        cfg.load_from = resnet_ckpt
        with pytest.raises(
                ConfigError,
                match=r'checkpoint does not fit the model: \S+resnet18.pth: '
                r'\d+ missing keys \(first: backbone\.layer2\.\S+\), '
                r'\d+ unexpected keys .*--partial-load'):
            runner = build_runner(cfg, splits=splits)
            runner.test() if splits == ('test', ) else runner.train()
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options=demo_options(tiny_shapes),
        partial_load=True)
    cfg.load_from = resnet_ckpt
    build_runner(cfg, splits=('test', )).test()


def test_load_from_may_fine_tune_the_classification_layer(
        tiny_shapes, aa_ckpt, tmp_path):
    """3 classes -> 2: the head's retina_cls is left out with a log line in
    training; testing with it is an error."""
    two = {
        'model.bbox_head.num_classes': 2,
        **{
            f'{s}_dataloader.dataset.metainfo.classes': ('circle', 'square')
            for s in ('train', 'val', 'test')
        }
    }
    cfg = config(tiny_shapes, tmp_path, **two)
    cfg.load_from = aa_ckpt
    runner = build_runner(cfg)
    runner.train()
    log = open(runner.logger.handlers[-1].baseFilename).read()
    assert re.search(
        r'WARNING - aa_det: load_from \S+aa.pth: 2 classification-layer keys '
        r'do not fit .*first: bbox_head.retina_cls.weight', log), log[-2000:]
    cfg = config(tiny_shapes, tmp_path, **two)
    cfg.load_from = aa_ckpt
    with pytest.raises(
            ConfigError,
            match=r'2 keys of another shape \(first: '
            r'bbox_head.retina_cls.weight\)'):
        build_runner(cfg, splits=('test', )).test()


def test_the_checked_checkpoint_is_read_once(tiny_shapes, aa_ckpt, tmp_path,
                                             monkeypatch):
    """CheckpointCheckHook reads the file; the Runner loads what it read
    (mmengine alone reads it once, and would a second time here)."""
    reads = []
    load = torch.load
    monkeypatch.setattr(
        torch, 'load', lambda f, *args, **kwargs:
        (reads.append(f), load(f, *args, **kwargs))[1])
    cfg = config(tiny_shapes, tmp_path)
    cfg.load_from = aa_ckpt
    runner = build_runner(cfg, splits=('test', ))
    runner.test()
    assert reads.count(aa_ckpt) == 1 and runner._has_loaded
    saved = load(aa_ckpt)['state_dict']['backbone.conv1.weight']
    assert torch.equal(runner.model.backbone.conv1.weight, saved)


def test_resume_from_another_models_checkpoint_is_one_line(
        tiny_shapes, resnet_ckpt, tmp_path):
    """Before: 'loaded state dict has a different number of parameter
    groups'."""
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options=demo_options(tiny_shapes, **ONE_ITER),
        resume=resnet_ckpt)
    with pytest.raises(
            ConfigError,
            match=r'does not fit the model: \S+resnet18.pth: \d+ missing keys'
    ) as error:
        build_runner(cfg).train()
    assert '--partial-load' not in str(error.value)


def test_resume_from_a_nan_checkpoint_stops_before_training(
        tiny_shapes, aa_ckpt, tmp_path):
    """Before: two epochs at loss nan, exit 0."""
    bad = edited_checkpoint(aa_ckpt, str(tmp_path / 'bad.pth'),
                            'backbone.conv1.weight', float('nan'))
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options=demo_options(tiny_shapes, **ONE_ITER),
        resume=bad)
    with pytest.raises(
            ConfigError,
            match=r'non-finite values .*bad.pth: first at state_dict\.'):
        build_runner(cfg).train()


@pytest.mark.slow  # 30-60 s of training; .ci/run runs it
def test_auto_resume_falls_back_past_a_truncated_latest_checkpoint(
        tiny_shapes, tmp_path):
    every_epoch = {
        'train_cfg.max_epochs': 2,
        'default_hooks.checkpoint.interval': 1
    }
    build_runner(config(tiny_shapes, tmp_path, **every_epoch)).train()
    latest = tmp_path / 'epoch_2.pth'
    assert open(tmp_path /
                'last_checkpoint').read().strip().endswith('epoch_2.pth')
    latest.write_bytes(latest.read_bytes()[:1000])  # the copy was cut
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        resume='auto',
        cfg_options=demo_options(tiny_shapes, **{
            **ONE_ITER, 'train_cfg.max_epochs': 2
        }))
    runner = build_runner(cfg)
    runner.train()
    assert runner._load_from == str(tmp_path / 'epoch_1.pth')
    # epoch 2 again, after epoch 1
    assert (runner.epoch, runner.iter) == (2, 2)
    log = open(runner.logger.handlers[-1].baseFilename).read()
    assert re.search(
        r'WARNING - aa_det: the latest checkpoint is unusable \(checkpoint '
        r'file cannot be loaded: \S+epoch_2.pth: it is truncated or '
        r'damaged.*\); resuming from \S+epoch_1.pth', log), log[-3000:]
    for path in glob.glob(str(tmp_path / 'epoch_*.pth')):
        open(path, 'wb').close()
    with pytest.raises(
            ConfigError,
            match=r'checkpoint file is empty \(0 bytes\): \S+epoch_2.pth'):
        build_runner(
            load_config(
                DEMO,
                work_dir=str(tmp_path),
                resume='auto',
                cfg_options=demo_options(tiny_shapes))).train()


def test_training_stops_on_a_non_finite_loss(tiny_shapes, tmp_path):
    """The runtime base's StopOnNonFiniteLoss (mmdet's CheckInvalidLossHook,
    every iteration) stops at the first one, before a checkpoint, with what
    mmdet's lacks: a line saying where and why (mmdet's asserts with the
    message None, every 50 iterations by default)."""
    runner = build_runner(
        config(tiny_shapes, tmp_path, **{'train_cfg.max_epochs': 2}))
    runner.model.backbone.register_forward_hook(
        lambda module, args, out: tuple(x * float('nan') for x in out))
    with pytest.raises(
            NonFiniteLossError,
            match=r'non-finite loss at epoch 1, iteration 1 \(loss: nan, '
            r'loss_cls: nan, loss_bbox: nan\)'):
        runner.train()
    assert not glob.glob(str(tmp_path / '*.pth'))


def test_runtime_failures_are_not_config_errors():
    """A run that goes wrong is a RuntimeError (the tools still print its one
    line), not a bad input."""
    for error in (NonFiniteLossError, NonFiniteOutputError):
        assert issubclass(error, RuntimeError) and not issubclass(
            error, ConfigError), error.__mro__


def test_validation_stops_on_non_finite_features(tiny_shapes, tmp_path):
    """Before: validation of NaN features reported every metric 0 (no boxes)
    and training went on."""
    runner = build_runner(
        config(tiny_shapes, tmp_path, **{'train_cfg.val_interval': 1}))
    runner.model.backbone.register_forward_hook(
        lambda module, args, out: out
        if module.training else tuple(x * float('nan') for x in out))
    with pytest.raises(
            NonFiniteOutputError,
            match=r'^validation stopped: non-finite outputs in 1 of 1 batches '
            r'\(first: backbone features, input 4x3x128x128, first at '
            r'backbone\)'):
        runner.train()
    # the epoch's checkpoint is kept
    assert glob.glob(str(tmp_path / 'epoch_1.pth'))


def test_resume_with_nothing_to_resume_says_so_and_trains(
        tiny_shapes, tmp_path):
    """``--resume`` in an empty work dir: one WARNING line, then training from
    scratch, as mmengine does (before: mmengine's INFO
    ``Auto resumed from the latest checkpoint None.``)."""
    options = demo_options(
        tiny_shapes, **{
            'train_cfg.max_epochs': 1,
            'train_dataloader.batch_size': 8
        })
    out = run_python(
        [
            osp.join(ROOT, 'tools', 'train.py'), DEMO, '--resume',
            '--work-dir', tmp_path / 'work', '--cfg-options'
        ] + [f'{k}={v}' for k, v in options.items()],
        env=ENV,
        cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f'WARNING - aa_det: resume: no checkpoint in {tmp_path / "work"} '
            f'to resume from; training starts from scratch' in out.stdout)
    assert osp.isfile(tmp_path / 'work' / 'epoch_1.pth')
