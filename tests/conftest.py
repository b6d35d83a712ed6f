"""Fixtures shared by the test modules; the tools' and the demo's modules
(``config_runner``, ``synthetic_shapes``, ...) importable, as their scripts
import them."""
import functools
import os.path as osp
import shutil
import sys

import mmengine.config.utils
import pytest
import torch

# mmengine parses every metafile of a package's model index (306 YAML files,
# about 0.5 s) each time a config names one of its bases by package scope; the
# tests load a few hundred configs, so the files, which are the installed
# package's, are parsed once in this process.
mmengine.config.utils.load = functools.lru_cache(maxsize=None)(
    mmengine.config.utils.load)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path += [
    osp.join(ROOT, 'tools'),
    osp.join(ROOT, 'tools', 'analysis_tools'),
    osp.join(ROOT, 'demo')
]

from synthetic_shapes import generate_shapes_coco  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` (what benchmarks/gpu_check.sh runs first on a GPU)
    skip where there is none."""
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason='needs a CUDA GPU')
        for item in items:
            if item.get_closest_marker('cuda'):
                item.add_marker(skip)


@pytest.fixture(scope='module')
def tiny_shapes(tmp_path_factory):
    """A COCO-format shapes dataset of 8 training and 4 validation images, 96
    px, per module."""
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes_coco(str(root), num_train=8, num_val=4, image_size=96)
    return root


@pytest.fixture
def data(tiny_shapes, tmp_path):
    """A copy of the tiny shapes data to damage."""
    return shutil.copytree(tiny_shapes, tmp_path / 'data')


@pytest.fixture(autouse=True)
def mmdet_scope():
    """Every test starts in mmdet's registry scope: a classification test
    (mmpretrain's scope, as its configs set it) must not decide where a later
    test's ``MODELS.build(dict(type='GSAResNet'))`` looks."""
    from mmengine.registry import init_default_scope

    init_default_scope('mmdet')
