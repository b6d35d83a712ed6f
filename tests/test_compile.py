"""torch.compile of the attention layers: one graph (``fullgraph=True``) in
training mode, one compile for every input size with dynamic shapes (multiscale
jitter), outputs and gradients as eager's, and the trained-offset record kept
(docs/design.md, "Compiling and exporting").

The default run captures with ``backend='aot_eager'`` (dynamo's graph and
AOTAutograd's forward and backward graphs, without inductor's code generation,
which takes minutes on 2 cores); the inductor test on whole backbones is marked
slow.
"""
import pytest
import torch

from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
from aa_det.utils.compat import TORCH_VERSION

pytestmark = pytest.mark.skipif(
    TORCH_VERSION < (2, 4),
    reason='torch.compile with dynamic shapes through '
    'autograd.Function needs torch >= 2.4')

#: multiscale jitter's sizes; for the AA layer (head dim 4) they give every
#: case of the fused kernel's padding that a trace could specialise
#: (``4 + H + W`` padded to a multiple of 8: 6, 1 and 0 zero columns)
SIZES = ((12, 10), (13, 14), (14, 14), (20, 18))


def _layer(kind):
    torch.manual_seed(0)
    if kind == 'aa':
        return AAConv2d(16, 32, 3, num_heads=2, min_key_dim_per_head=4)
    return GlobalSelfAttention2d(16, 16, num_heads=2)


@pytest.mark.parametrize('kind', ['aa', 'gsa'])
def test_layer_compiles_to_one_graph_for_every_size(kind):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    eager, compiled_layer = _layer(kind).train(), _layer(kind).train()
    compiled = torch.compile(
        compiled_layer, fullgraph=True, dynamic=True, backend='aot_eager')
    for H, W in SIZES:
        x = torch.randn(
            2, 16, H, W, generator=torch.Generator().manual_seed(H))
        results = []
        for module, fn in ((eager, eager), (compiled_layer, compiled)):
            xs = x.clone().requires_grad_()
            out = fn(xs)
            grads = torch.autograd.grad(out.square().sum(),
                                        [xs] + list(module.parameters()))
            results.append((out, grads))
        (ref, ref_g), (out, g) = results
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        for a, b in zip(g, ref_g):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert counters['stats']['unique_graphs'] == 1  # no recompile per size
    # folds the in-graph record into the integers
    eager.eval(), compiled_layer.eval()
    assert (compiled_layer.offset_range.trained == eager.offset_range.trained
            == [19, 17])


def test_aa_layer_compiled_under_autocast_keeps_its_dtype():
    """While a graph is captured, AA's output projection is a GEMM plus bias
    (not the 1x1 conv): its output keeps autocast's dtype, as eager's (an fp32
    bias once promoted it to fp32)."""
    torch._dynamo.reset()
    layer = _layer('aa').train()
    x = torch.randn(2, 16, 12, 10)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        ref = layer(x)
        out = torch.compile(layer, backend='aot_eager', fullgraph=True)(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.05, atol=0.05)


@pytest.mark.slow  # 35-75 s of inductor; .ci/run runs it
def test_aa_layer_compiles_with_inductor_and_dynamic_shapes():
    """Inductor (CPU), ``fullgraph=True``, ``dynamic=True``, training mode: the
    AA layer's output projection stopped inductor at its first size (a saved
    view whose symbolic strides it could not order; docs/design.md). Outputs
    and gradients as eager's. About 40 s on 2 cores, cold cache."""
    torch._dynamo.reset()
    eager, compiled_layer = _layer('aa').train(), _layer('aa').train()
    compiled = torch.compile(compiled_layer, fullgraph=True, dynamic=True)
    x = torch.randn(2, 16, 12, 10, generator=torch.Generator().manual_seed(0))
    results = []
    for module, fn in ((eager, eager), (compiled_layer, compiled)):
        xs = x.clone().requires_grad_()
        out = fn(xs)
        results.append((out,
                        torch.autograd.grad(out.square().sum(),
                                            [xs] + list(module.parameters()))))
    (ref, ref_g), (out, g) = results
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('backbone', ['AAResNet', 'GSAResNet'])
def test_backbone_compiles_with_inductor_fullgraph(backbone):
    """A narrow backbone, training mode, CPU inductor, ``fullgraph=True``:
    outputs and gradients as eager's (about 5 minutes on 2 cores)."""
    from mmdet.registry import MODELS

    import aa_det  # noqa: F401
    torch.manual_seed(0)
    cfg = dict(
        type=backbone,
        depth=18 if backbone == 'AAResNet' else 26,
        base_channels=16,
        attention=dict(
            num_heads=2,
            **(dict(
                min_key_dim_per_head=4) if backbone == 'AAResNet' else {})))
    model = MODELS.build(cfg)
    model.train()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 3, 64, 64)
    out, ref = compiled(x)[-1], model(x)[-1]
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
    g = torch.autograd.grad(
        out.square().sum(), list(model.parameters()), allow_unused=True)
    g_ref = torch.autograd.grad(
        ref.square().sum(), list(model.parameters()), allow_unused=True)
    for a, b in zip(g, g_ref):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize('hook',
                         ['CompileBackboneHook', 'StaticModuleIntsHook'])
@pytest.mark.parametrize('kind', ['aa', 'gsa'])
def test_compile_hooks_trace_module_ints_as_constants(kind, hook):
    """``CompileBackboneHook(dynamic=True)``, and ``StaticModuleIntsHook`` on
    what mmengine's ``compile`` option compiled: the layers' int attributes
    (heads, channels) are constants in the graph, not symbolic inputs, on every
    torch release (torch 2.4 - 2.5 made them symbolic: the demo backbone's
    first trace took over 590 s instead of 72 s on 2.4.1)."""
    from types import SimpleNamespace

    from aa_det.engine import hooks
    torch._dynamo.reset()
    inputs = []

    def backend(gm, example_inputs):
        inputs.extend((n.name, n.meta.get('example_value'))
                      for n in gm.graph.nodes if n.op == 'placeholder')
        return gm.forward

    layer = _layer(kind).train()
    runner = SimpleNamespace(
        model=SimpleNamespace(backbone=layer),
        logger=SimpleNamespace(info=lambda message: None))
    if hook == 'CompileBackboneHook':
        hooks.CompileBackboneHook(
            backend=backend, dynamic=True).before_train(runner)
        step = runner.model.backbone
    else:  # as the Runner's _maybe_compile('train_step') leaves it
        runner.model.train_step = torch.compile(
            layer.forward, backend=backend, dynamic=True)
        hooks.StaticModuleIntsHook().before_train(runner)
        step = runner.model.train_step
    step(torch.randn(2, 16, 12, 10))
    # the layer's forward was compiled
    assert any(name == 'l_x_' for name, _ in inputs)
    assert not [
        name for name, value in inputs
        if name.startswith('l_self') and isinstance(value, torch.SymInt)
    ]


@pytest.mark.slow  # 10-20 s; .ci/run runs it
def test_with_cp_backbone_compiles_with_graph_breaks_and_right_statistics():
    """A backbone with ``with_cp=True`` under ``torch.compile``: its
    checkpointed blocks run eagerly between graphs, with the same gradients and
    BatchNorm statistics as eager without ``with_cp`` (dynamo took mmdet's
    reentrant checkpoint eagerly too, and ran each BatchNorm twice);
    ``CompileBackboneHook``'s ``fullgraph=True`` is refused up front, by
    name."""
    from types import SimpleNamespace

    from mmdet.registry import MODELS

    from aa_det.engine import ConfigError, hooks
    torch._dynamo.reset()

    def build(with_cp):
        torch.manual_seed(0)
        model = MODELS.build(
            dict(
                type='GSAResNet',
                depth=26,
                base_channels=16,
                with_cp=with_cp,
                norm_eval=False,
                attention=dict(num_heads=2)))
        model.train()
        return model

    ref, cp = build(False), build(True)
    x = torch.randn(2, 3, 64, 64)
    sum(o.sum() for o in ref(x)).backward()
    sum(o.sum() for o in torch.compile(cp, backend='aot_eager', dynamic=True)(
        x)).backward()
    for (name, a), b in zip(ref.named_parameters(), cp.parameters()):
        torch.testing.assert_close(
            b.grad, a.grad, rtol=1e-4, atol=1e-4, msg=name)
    buffers = dict(cp.named_buffers())
    for name, a in ref.named_buffers():
        torch.testing.assert_close(buffers[name], a, msg=name)
    runner = SimpleNamespace(
        model=SimpleNamespace(backbone=cp), logger=SimpleNamespace(info=print))
    with pytest.raises(
            ConfigError,
            match='fullgraph=True cannot capture the backbone.s with_cp=True'):
        hooks.CompileBackboneHook(backend='aot_eager').before_train(runner)
    hooks.CompileBackboneHook(
        backend='aot_eager', fullgraph=False).before_train(runner)


#: how far the compiled backbone's outputs may be from the float64 eager ones,
#: in multiples of eager's own distance (mean absolute error per FPN input): 2
#: CPU cores, torch 2.14.1, GSA-ResNet-50 at 640x640 measured 2.5-3.6x in
#: float32 and 1.0x in bf16 (inductor's vectorised exp and reductions round
#: differently; a wrong graph is off by the outputs' own size, hundreds of
#: times eager's rounding)
ROUNDING_FACTOR = 10


@pytest.mark.slow
@pytest.mark.parametrize('backbone,policy,norm_eval',
                         [('AAResNet', 'cpu', True),
                          ('GSAResNet', 'cpu', False),
                          ('AAResNet', 'cuda', True),
                          ('GSAResNet', 'cuda', False)])
def test_resnet50_backbone_compiles_at_full_size(backbone, policy, norm_eval):
    """AA-ResNet-50 and GSA-ResNet-50 at 640x640, training mode, compiled by
    ``CompileBackboneHook`` (inductor, ``fullgraph=True``) as a config's
    ``custom_hooks`` does: every output as close to a float64 eager run as
    eager's own float32 (bf16 under the ``'cuda'`` policy) is, within
    :data:`ROUNDING_FACTOR`: GSA-ResNet-50 with training BatchNorm at batch 1
    amplifies rounding a thousandfold over its depth (eager float32 is 0.18
    from float64 at stage 4 at 256x256), so no fixed tolerance against eager
    tells rounding from a wrong graph. In float32 AA's outputs and gradients
    are eager's within 1e-3 too. AA with mmdet's frozen BatchNorm
    (``norm_eval=True``), GSA with training BatchNorm (GSA with fresh running
    statistics is not finite at this size, docs/design.md). The ``'cuda'`` case
    runs the CUDA path's kernels (AA's ``impl='sdpa'``, CUDA's before torch
    2.6) on CPU tensors under bf16 autocast (under CPU fp16 autocast inductor
    stops in ``at::autocast::prioritize``), with concatenations lowered as on
    GPUs (``force_pointwise_cat``, torch >= 2.5). Prints the compile time
    (docs/benchmarks.md); minutes per case on 2 cores."""
    import copy
    import time
    from contextlib import nullcontext
    from types import SimpleNamespace

    from mmdet.registry import MODELS

    import aa_det  # noqa: F401
    from aa_det.engine import hooks
    from aa_det.models.layers import AAConv2d
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MODELS.build(dict(type=backbone, depth=50, norm_eval=norm_eval))
    model.train()  # mmdet's ResNet.train returns None
    x = torch.randn(1, 3, 640, 640, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # float64: the reference of both runs
        exact = copy.deepcopy(model).double()(x.double())
    amp = torch.autocast('cpu', dtype=torch.bfloat16, enabled=policy == 'cuda')
    for module in model.modules():
        if isinstance(module, AAConv2d) and policy == 'cuda':
            # CUDA's kernel before torch 2.6 (FlexAttention has no CPU
            # backward)
            module.impl = 'sdpa'
    with amp:
        ref = model(x)
    # compared with eager's below
    exact_gradients = backbone == 'AAResNet' and policy == 'cpu'
    g_ref = torch.autograd.grad(
        ref[-1].square().sum(), list(model.parameters()),
        allow_unused=True) if exact_gradients else None
    runner = SimpleNamespace(
        model=SimpleNamespace(backbone=model),
        logger=SimpleNamespace(info=print))
    hooks.CompileBackboneHook().before_train(runner)
    start = time.time()
    gpu_lowering = policy == 'cuda' and hasattr(torch._inductor.config,
                                                'force_pointwise_cat')
    with torch._inductor.config.patch(
            force_pointwise_cat=True) if gpu_lowering else nullcontext():
        with amp:
            out = model(x)
        g = torch.autograd.grad(
            out[-1].float().square().sum(),
            list(model.parameters()),
            allow_unused=True)
    print(f'{backbone} ({policy} policy) compiled at 640x640 in '
          f'{time.time() - start:.0f} s (first forward + backward)')
    for level, (e, r, o) in enumerate(zip(exact, ref, out)):
        eager_error, compiled_error = ((t.double() - e).abs().mean().item()
                                       for t in (r, o))
        print(f'level {level}: mean |eager - float64| {eager_error:.3g}, '
              f'|compiled - float64| {compiled_error:.3g}')
        assert compiled_error <= ROUNDING_FACTOR * eager_error + 1e-7, level
    assert all(t.isfinite().all() for t in g if t is not None)
    if exact_gradients:
        torch.testing.assert_close(out[-1], ref[-1], rtol=1e-3, atol=1e-3)
        # each gradient within 1e-3 of its largest element (reassociated sums)
        for a, b in zip(g, g_ref):
            assert (a is None) == (b is None) and (
                b is None or
                (a - b).abs().max() <= 1e-3 * b.abs().max() + 1e-6)


@pytest.mark.slow  # 1-2 min of tracing on 2 cores
@pytest.mark.parametrize('backbone', ['AAResNet', 'GSAResNet'])
def test_backbone_traces_to_one_graph_with_cuda_choices_under_autocast(
        backbone):
    """With the CUDA device policy forced on CPU tensors (AA: FlexAttention
    where torch has it; GSA: bfloat16 for float16 and one chunk), each
    ResNet-50 backbone's forward traces with ``fullgraph=True`` and
    ``dynamic=True`` under fp16 and bf16 autocast into one graph that two input
    sizes share (the device query, bfloat16 support, answered outside the
    traced code; tests/test_cuda_path.py traces it on a GPU)."""
    from mmdet.registry import MODELS
    from torch._dynamo.utils import counters

    import aa_det  # noqa: F401
    from aa_det.models.layers.device_policy import forced_device_policy

    torch.manual_seed(0)
    stages = dict(
        stage_with_attention=(False, False, True,
                              True)) if backbone == 'GSAResNet' else {}
    model = MODELS.build(
        dict(type=backbone, depth=50, norm_eval=False, **stages))
    model.train()  # mmdet's ResNet.train returns None
    for dtype in (torch.float16, torch.bfloat16):
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(
            model, fullgraph=True, dynamic=True, backend='eager')
        with forced_device_policy('cuda'), torch.no_grad(), torch.autocast(
                'cpu', dtype=dtype):
            for size in (96, 128):
                outs = compiled(torch.randn(1, 3, size, size))
                assert all(o.isfinite().all() for o in outs)
        assert counters['stats']['unique_graphs'] == 1, (
            dtype, dict(counters['stats']))
        assert not counters['graph_break'], dict(counters['graph_break'])
