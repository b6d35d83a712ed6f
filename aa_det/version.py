"""The package's version and the versions of the stack it runs on.

setup.py and tools/env/env_check.py read this file without importing the
package (``import aa_det`` imports torch, mmcv and mmdet), so it imports
nothing.
"""

__version__ = '0.1.0'
short_version = __version__
version_info = tuple(int(x) for x in __version__.split('.'))

#: The supported range of each package of the stack, as pip requirements.
#: They are not install requirements: torch and torchvision come from the
#: user's environment, with an mmcv compiled for them, and pip would replace
#: them; requirements/mminstall.txt lists the OpenMMLab ones for
#: ``mim install`` (tests/test_packaging.py keeps the two equal).
#: tools/env/env_check.py checks the installed versions against these.
#: The floor, torch 2.1, is the newest torch with prebuilt mmcv 2.1.0 wheels
#: (what ``mim install`` gives mmdet 3.3 users; torch 2.0's
#: scaled_dot_product_attention has no ``scale``); the top is the pinned
#: stack of requirements/constraints.txt.
SUPPORTED_VERSIONS = (
    'torch>=2.1,<2.15',
    'torchvision>=0.16',
    'mmcv>=2.0.0,<2.2.0',
    'mmengine>=0.10,<0.11',
    'mmdet>=3.3.0,<3.4',
)
