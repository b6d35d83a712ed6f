"""The attention kernels' device policy: one place that picks kernels, dtypes and block sizes.

Bello et al. (AA, ICCV 2019) eq. (3) and Shen et al. (GSA) eq. (1), (5)-(7) are computed by several exact
kernels (``relative_attention.py``, ``gsa.py``); the policy is the tensors' device's (``'cuda'`` for CUDA,
``'cpu'`` otherwise) or :func:`force_policy`'s. See docs/design.md, "One device policy".

Example:
    >>> import torch
    >>> kernel_device('cpu'), choose_impl('cpu', 10 ** 6, torch.bfloat16)
    ('cpu', 'blocked')
    >>> with force_policy('cuda'):
    ...     dev = kernel_device('cpu')
    ...     print(dev, choose_impl(dev, 10 ** 6, torch.bfloat16), axial_chunk_elems(dev) == CUDA_AXIAL_ELEMS)
    cuda sdpa True
"""
import functools
from contextlib import contextmanager
from typing import Callable, List, Optional, Sequence

import torch

from ...utils.compat import is_capturing_graph

POLICIES = ('cpu', 'cuda')

#: AA 'blocked' kernel: logits ``B * Nh * queries * keys`` held at once on the CPU (16 MiB in fp32, cache-sized).
CPU_BLOCK_ELEMS = 1 << 22
#: AA on CUDA in float32: logits up to this many are materialised at once (64 MiB), see choose_impl.
CUDA_MATERIALIZE_ELEMS = 1 << 24
#: GSA axial kernel: logits ``[sequences, L, L]`` computed at once. CPU: cache-sized (4 MiB in fp32).
#: CUDA: one chunk wherever it fits in 1 GiB of fp32 logits, chunks of that size beyond.
CPU_AXIAL_ELEMS = 1 << 20
CUDA_AXIAL_ELEMS = 1 << 28

_forced: Optional[str] = None


def kernel_device(device_type: str) -> str:
    """The policy tensors on ``device_type`` take: the forced one, else ``'cuda'`` for CUDA
    and ``'cpu'`` for every other device."""
    if _forced is not None:
        return _forced
    return 'cuda' if device_type == 'cuda' else 'cpu'


@contextmanager
def force_policy(name: Optional[str]):
    """Run every attention kernel with policy ``name`` (``'cpu'``, ``'cuda'``, or None for
    the tensors' own device), whatever device its tensors are on (CI tests the CUDA path so).
    """
    global _forced
    if name is not None and name not in POLICIES:
        raise ValueError(f'force_policy: policy must be one of {POLICIES} or None, got {name!r}')
    previous, _forced = _forced, name
    try:
        yield
    finally:
        _forced = previous


#: True while a graph is captured (compile, export, trace): kernels without size-dependent Python loops
graph_mode = is_capturing_graph


def size_constant(build: Callable[..., torch.Tensor], *args, **kwargs) -> torch.Tensor:
    """``build(*args, **kwargs)``: a constant of the map size (a relative-offset index, the fused
    kernel's one-hot columns, a zero to expand). Cached per arguments outside a captured graph (no
    kernel after a size's first step); built in the graph while one is captured (no size baked in)."""
    if graph_mode():
        return build(*args, **kwargs)
    return _cached_constant(build, *args, **kwargs)


#: the constants of the sizes seen last (multiscale jitter: a few sizes per stage and axis)
_cached_constant = functools.lru_cache(maxsize=256)(lambda build, *args, **kwargs: build(*args, **kwargs))


def packed(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` contiguous in ``dtype``, in one copy (the cast and the layout change together)."""
    return t.contiguous() if t.dtype == dtype else t.to(dtype, memory_format=torch.contiguous_format)


def cast_together(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> List[torch.Tensor]:
    """``tensors`` in ``dtype`` through one concatenation and one cast, their gradients back through one
    concatenation and one cast: 4 kernels a step, where autocast casts each tensor where it is used and each
    gradient back, 2 per tensor."""
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(dtype)
    return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def choose_impl(device_type: str, num_logits: int, amp_dtype: Optional[torch.dtype] = None) -> str:
    """The fastest exact AA kernel for ``num_logits = B * Nh * (HW)^2`` under policy ``device_type``
    (docs/design.md, "Precision under AMP").

    CPU: 'blocked'. CUDA under fp16 / bf16 autocast (``amp_dtype``): 'sdpa'. CUDA in float32: 'materialized'
    up to ``CUDA_MATERIALIZE_ELEMS`` logits, 'sdpa' above. In a captured graph: 'sdpa'. In the TorchScript
    ONNX exporter: 'materialized' (ONNX has no fused attention).
    """
    if torch.onnx.is_in_onnx_export():
        return 'materialized'
    if device_type == 'cuda':
        if amp_dtype in (torch.float16, torch.bfloat16):
            return 'sdpa'
        return 'materialized' if num_logits <= CUDA_MATERIALIZE_ELEMS else 'sdpa'
    return 'sdpa' if graph_mode() else 'blocked'


def kernel_dtype(device_type: str, impl: str, input_dtype: torch.dtype,
                 amp_dtype: Optional[torch.dtype] = None) -> torch.dtype:
    """The dtype an AA kernel computes in under policy ``device_type``.

    float32 (float64 stays float64); the fused CUDA kernel under fp16 / bf16 autocast takes the autocast
    dtype (its logits are float32 inside).
    """
    if device_type == 'cuda' and impl == 'sdpa' and amp_dtype in (torch.float16, torch.bfloat16):
        return amp_dtype
    return torch.promote_types(input_dtype, torch.float32)


def compute_dtype(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype GSA's attention products compute in under policy ``device_type``, for inputs
    of ``dtype`` (autocast's under AMP).

    No softmax bounds GSA's outputs, which can leave float16's range, so float16 inputs compute in
    bfloat16 where the device has it, else in float32; other dtypes as they are.
    """
    if dtype != torch.float16:
        return dtype
    if device_type == 'cuda' and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return torch.float32
    return torch.bfloat16


def axial_chunk_elems(device_type: str) -> Optional[int]:
    """Logits ``[sequences, L, L]`` GSA's axial kernel computes at once under policy
    ``device_type``; None (all at once) while a graph is captured."""
    if graph_mode():
        return None
    return CUDA_AXIAL_ELEMS if device_type == 'cuda' else CPU_AXIAL_ELEMS
