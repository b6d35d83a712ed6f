"""The attention layers read like the papers: every parameterised submodule runs as a module, each forward
stays within a few functions and files of the package, and the layer code stays short."""
import ast
import pathlib
import sys

import pytest
import torch

import aa_det
from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d

PACKAGE = pathlib.Path(aa_det.__file__).parent
LAYERS = PACKAGE / 'models' / 'layers'


def _layers():
    torch.manual_seed(0)
    return {'aa': AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4),
            'gsa': GlobalSelfAttention2d(16, 16, num_heads=4)}


@pytest.mark.parametrize('autocast', [False, True])
@pytest.mark.parametrize('kind', ['aa', 'gsa'])
def test_every_submodule_with_parameters_runs_as_a_module(kind, autocast):
    """A forward hook on every submodule that has parameters (``qkv``, ``proj``, ``conv``; ``norm_col``) is
    called, in float32 and under bf16 autocast, so mmengine's hooks and wrappers see them."""
    layer = _layers()[kind].train()
    called, handles = set(), []
    for name, module in layer.named_modules():
        if name and any(True for _ in module.parameters(recurse=False)):
            handles.append(module.register_forward_hook(lambda m, i, o, name=name: called.add(name)))
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        layer(torch.randn(2, 16, 9, 11))
    expected = {'aa': {'qkv', 'proj', 'conv'}, 'gsa': {'qkv', 'norm_col'}}[kind]
    assert called == expected == {name for name, m in layer.named_modules()
                                  if name and any(True for _ in m.parameters(recurse=False))}


def _functions_entered(layer, x, autocast):
    """The package's functions (file, name) a forward enters, by ``sys.setprofile``."""
    entered = set()

    def profile(frame, event, arg):
        if event == 'call' and frame.f_code.co_filename.startswith(str(PACKAGE)):
            entered.add((frame.f_code.co_filename, frame.f_code.co_firstlineno, frame.f_code.co_name))

    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        sys.setprofile(profile)
        try:
            layer(x)
        finally:
            sys.setprofile(None)
    return entered


@pytest.mark.parametrize('kind', ['aa', 'gsa'])
def test_a_forward_enters_at_most_15_functions_in_3_files(kind):
    """Over AA's CPU ('auto': 'blocked') and CUDA ('sdpa') kernels, GSA's one- and many-chunk columns, fp32 and bf16,
    training (records offsets) and inference (reads them): at most 15 distinct package functions in 3 files."""
    layer = _layers()[kind]
    x = torch.randn(2, 16, 40, 36)
    entered = set()
    for impl in (('auto', 'sdpa') if kind == 'aa' else ('auto',)):
        if kind == 'aa':
            layer.impl = impl
        for train in (True, False):
            layer.train(train)
            for autocast in (False, True):
                entered |= _functions_entered(layer, x, autocast)
    files = {f for f, _, _ in entered}
    assert len(entered) <= 15 and len(files) <= 3, sorted((pathlib.Path(f).name, n) for f, _, n in entered)


def _helpers_of_the_layers():
    """The package files the layers import (utils/compat.py aside)."""
    files = set(LAYERS.glob('*.py'))
    for path in list(files):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                module = PACKAGE / pathlib.Path(*(node.module or '').split('.'))
                files.add(module.with_suffix('.py'))
    return {f for f in files if f.name != 'compat.py'}


def test_layer_code_is_short():
    """``models/layers/`` and what it imports from the package (but ``utils/compat.py``) at most 900 lines, no
    function over 60, no call of a module's private ``_conv_forward`` anywhere in the package."""
    files = _helpers_of_the_layers()
    assert sum(len(f.read_text().splitlines()) for f in files) <= 900
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 60, (path.name, node.name)
    for path in PACKAGE.rglob('*.py'):
        assert '_conv_forward' not in path.read_text(), path
