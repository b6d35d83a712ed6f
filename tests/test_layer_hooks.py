"""The attention layers call every parameterised submodule as a module, so the
hooks of mmengine and mmdet and FLOP counters see them."""
import pytest
import torch

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d


def _layer(kind):
    torch.manual_seed(0)
    if kind == 'aa':
        return AAConv2d(16, 32, 3, num_heads=4, min_key_dim_per_head=4)
    return GlobalSelfAttention2d(16, 16, num_heads=4)


@pytest.mark.parametrize('autocast', [False, True])
@pytest.mark.parametrize('kind', ['aa', 'gsa'])
def test_every_submodule_with_parameters_runs_as_a_module(kind, autocast):
    """A forward hook on every submodule that has parameters (``qkv``,
    ``proj``, ``conv``; ``norm_col``) is called, in float32 and under bf16
    autocast."""
    layer = _layer(kind).train()
    with_parameters = {
        name
        for name, module in layer.named_modules()
        if name and any(True for _ in module.parameters(recurse=False))
    }
    called = set()
    for name, module in layer.named_modules():
        if name in with_parameters:
            module.register_forward_hook(
                lambda m, i, o, name=name: called.add(name))
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        layer(torch.randn(2, 16, 9, 11))
    assert called == with_parameters == {
        'aa': {'qkv', 'proj', 'conv'},
        'gsa': {'qkv', 'norm_col'}
    }[kind]
