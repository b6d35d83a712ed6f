"""aa_det: Attention Augmented and Global Self-Attention ResNets for
MMDetection 3.x.

Installs into an environment that has torch, torchvision, mmcv, mmengine and
mmdet (``mim install -r requirements/mminstall.txt`` brings the OpenMMLab
ones) and changes none of them. Their supported ranges live in
aa_det/version.py; the tested stacks are pinned in
requirements/constraints*.txt (docs/setup.md).
"""
import os
import os.path as osp
import shutil
import sys
import warnings
from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))
VERSION_FILE = osp.join(ROOT, 'aa_det', 'version.py')
#: what OpenMMLab packages ship in ``<package>/.mim`` for mim and for users
#: of the wheel: the configs with their metafiles, the tools and the demo
#: scripts (the demo data generator among them)
MIM_FILES = ('configs', 'tools', 'demo', 'model-index.yml')


def readme():
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        return f.read()


def get_version():
    """``__version__`` of aa_det/version.py, read without importing aa_det
    (whose import needs torch and mmdet)."""
    namespace = {}
    with open(VERSION_FILE) as f:
        exec(compile(f.read(), VERSION_FILE, 'exec'), namespace)
    return namespace['__version__']


def parse_requirements(fname):
    """The requirements of ``requirements/<fname>``: one per line, ``#``
    comments and blank lines dropped, ``-r other.txt`` followed."""
    path = osp.join(ROOT, 'requirements', fname)
    requirements = []
    with open(path) as f:
        for line in f:
            line = line.split('#')[0].strip()
            if line.startswith('-r '):
                requirements += parse_requirements(line[3:].strip())
            elif line:
                requirements.append(line)
    return requirements


def add_mim_extension():
    """Put MIM_FILES into ``aa_det/.mim``, where mim and the wheel's users
    find them: symlinks for an editable install (``pip install -e .``), so
    the checkout's files stay the ones used; copies for a wheel or an sdist
    (``pip install .``, ``pip wheel .``, ``mim install .``)."""
    if 'develop' in sys.argv or 'editable_wheel' in sys.argv:
        mode = 'symlink'
    elif 'bdist_wheel' in sys.argv or 'sdist' in sys.argv:
        mode = 'copy'
    else:
        return
    mim_path = osp.join(ROOT, 'aa_det', '.mim')
    os.makedirs(mim_path, exist_ok=True)
    for name in MIM_FILES:
        src_path = osp.join(ROOT, name)
        if not osp.exists(src_path):
            continue  # a build from an sdist: its .mim holds the copies
        tar_path = osp.join(mim_path, name)
        if osp.islink(tar_path) or osp.isfile(tar_path):
            os.remove(tar_path)
        elif osp.isdir(tar_path):
            shutil.rmtree(tar_path)
        if mode == 'symlink':
            try:
                os.symlink(osp.relpath(src_path, mim_path), tar_path)
                continue
            except OSError:  # no symlinks (Windows without the privilege)
                warnings.warn(f'cannot symlink {tar_path}: copied instead')
        if osp.isfile(src_path):
            shutil.copyfile(src_path, tar_path)
        else:
            shutil.copytree(
                src_path,
                tar_path,
                ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))


if __name__ == '__main__':
    add_mim_extension()
    mim = parse_requirements('mminstall.txt')
    cls = parse_requirements('cls.txt')
    vis = parse_requirements('vis.txt')
    setup(
        name='aa_det',
        version=get_version(),
        description='Attention Augmented and Global Self-Attention ResNets '
        'for MMDetection',
        long_description=readme(),
        long_description_content_type='text/markdown',
        keywords='computer vision, object detection, self-attention',
        packages=find_packages(include=['aa_det', 'aa_det.*']),
        include_package_data=True,  # aa_det/.mim, as MANIFEST.in lists it
        classifiers=[
            'Development Status :: 4 - Beta',
            'Operating System :: OS Independent',
            'Programming Language :: Python :: 3',
        ],
        license='Apache License 2.0',
        python_requires='>=3.9',
        # no torch, torchvision, mmcv, mmengine or mmdet: pip would replace
        # the environment's builds (mim extra, mminstall.txt)
        install_requires=parse_requirements('runtime.txt'),
        extras_require={
            'mim': mim,
            'cls': cls,
            'vis': vis,
            'all': cls + vis,
            # everything the test suite imports (tools/env/setup_env.sh)
            'tests': parse_requirements('tests.txt') + mim + cls + vis,
        },
        zip_safe=False)
