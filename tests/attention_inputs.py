"""Inputs and the error measure shared by the low-precision tests
(tests/test_low_precision.py) and the tests of what a GPU runs
(tests/test_cuda_path.py); what a layer keeps for its backward (the AA and GSA
tests)."""
import torch


def rel_err(a, ref):
    """Relative Frobenius error of ``a`` against the float64 ``ref``."""
    return ((a.double() - ref).norm() / ref.norm()).item()


def aa_inputs(seed, B=2, Nh=4, H=12, W=10, d=20, dv=3, max_dist=12):
    """float64 ``q, k, v`` ``[B, Nh, HW, d]`` (``v``: ``dv``), relative tables
    ``[2 max_dist - 1, d]`` (height, width) and an output gradient
    ``[B, Nh, HW, dv]``, from ``seed``."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    return (rnd(B, Nh, H * W, d, scale=d**-0.5), rnd(B, Nh, H * W, d),
            rnd(B, Nh, H * W, dv), rnd(2 * max_dist - 1, d, scale=d**-0.5),
            rnd(2 * max_dist - 1, d, scale=d**-0.5), rnd(B, Nh, H * W, dv))


def saved_numel(layer, x):
    """Elements of the activations a training forward of ``layer`` keeps for
    its backward (parameters aside), and the output."""
    params = {p.data_ptr() for p in layer.parameters()}
    saved = []

    def pack(t):
        saved.append(0 if t.data_ptr() in params else t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    return sum(saved), out
