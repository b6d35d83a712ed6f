"""aa_det: attention backbones (AA-ResNet, GSA-ResNet) for MMDetection 3.x.

Supported ranges live in requirements/runtime.txt (also read by tools/env/env_check.py); the three
tested stacks are pinned in requirements/constraints.txt (torch 2.14), constraints-torch2.1.txt and
constraints-torch2.4.txt.
Into an environment that already has torch, mmcv and mmdet: ``pip install --no-deps -e .``.
"""
import os.path as osp

from setuptools import find_packages, setup


def parse_requirements(path):
    """The requirement lines of ``path``, comments and blank lines dropped."""
    with open(osp.join(osp.dirname(osp.abspath(__file__)), path)) as f:
        return [line.split('#')[0].strip() for line in f if line.split('#')[0].strip()]


setup(
    name='aa_det',
    version='0.1.0',
    description='Attention Augmented and Global Self-Attention ResNets for MMDetection',
    packages=find_packages(include=['aa_det', 'aa_det.*']),
    python_requires='>=3.9',
    install_requires=parse_requirements('requirements/runtime.txt'),
    extras_require={'tests': ['pytest', 'pytest-xdist',  # tools/test.sh runs two workers
                              'onnx', 'onnxruntime', 'onnxscript',  # exports checked in onnxruntime
                              'scikit-image']},  # its photographs: benchmarks/backbone_benchmark.py
)
