"""Helpers of the tests that damage a run's inputs: edit an annotation file,
and assert that a Runner stops with one line before its first training
iteration."""
import json

import pytest
from mmengine.hooks import Hook

from aa_det.utils import ConfigError


def edit_json(path, change):
    """Apply ``change`` to the JSON file ``path`` in place."""
    coco = json.loads(path.read_text())
    change(coco)
    path.write_text(json.dumps(coco))


def assert_stops_before_training(runner, pattern, run='train'):
    """``runner.train()`` (or ``test()``) raises a :class:`ConfigError`
    matching ``pattern`` and no training iteration ran."""
    steps = []

    class Spy(Hook):

        def before_train_iter(self, *args, **kwargs):
            steps.append(1)

    runner.register_hook(Spy())
    with pytest.raises(ConfigError, match=pattern):
        getattr(runner, run)()
    assert steps == []
