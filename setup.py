"""aa_det: attention backbones (AA-ResNet, GSA-ResNet) for MMDetection 3.x.

Pinned versions live in requirements/constraints.txt; tools/env/setup_env.sh installs against them.
"""
from setuptools import find_packages, setup

setup(
    name='aa_det',
    version='0.1.0',
    description='Attention Augmented and Global Self-Attention ResNets for MMDetection',
    packages=find_packages(include=['aa_det', 'aa_det.*']),
    python_requires='>=3.9',
    install_requires=[
        'torch>=2.1',
        'torchvision',
        'mmengine>=0.10,<0.11',
        'mmcv>=2.0.0,<2.2.0',
        'mmdet>=3.3.0,<3.4',
        'pycocotools',
        'matplotlib',
        'tensorboard',  # mmengine's TensorboardVisBackend (optional logging backend)
        'psutil',  # mmdet's analysis_tools/benchmark.py
    ],
    extras_require={'tests': ['pytest']},
)
