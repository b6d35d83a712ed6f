"""Fixtures shared by the test modules."""
import pytest

from aa_det.datasets import generate_shapes_coco


@pytest.fixture(scope='module')
def tiny_shapes(tmp_path_factory):
    """A COCO-format shapes dataset of 8 training and 4 validation images, 96 px, per module."""
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes_coco(str(root), num_train=8, num_val=4, image_size=96)
    return root


@pytest.fixture(autouse=True)
def mmdet_scope():
    """Every test starts in mmdet's registry scope: a classification test (mmpretrain's scope, as its
    configs set it) must not decide where a later test's ``MODELS.build(dict(type='GSAResNet'))``
    looks."""
    from mmengine.registry import init_default_scope

    init_default_scope('mmdet')
