"""The torch APIs that differ between the supported releases, in one place.

aa_det supports torch 2.1 (the newest release with prebuilt mmcv 2.1.0 wheels,
what ``mim install`` gives mmdet 3.3 users) up to the pinned 2.14
(``aa_det/version.py`` holds the ranges). Every call whose signature or
existence depends on the torch release goes through this module; each branch
says which releases take it.

Example:
    >>> import torch
    >>> autocast_dtype('cpu') is None
    True
    >>> with torch.autocast('cpu', dtype=torch.bfloat16):
    ...     autocast_dtype('cpu')
    torch.bfloat16
"""
import functools
from typing import Callable, Optional

import torch
from mmengine.utils import digit_version

#: The running torch release as ``(major, minor)``, e.g. ``(2, 1)``.
TORCH_VERSION = tuple(digit_version(torch.__version__)[:2])

# FlexAttention with gradients of the tensors its score_mod reads
if TORCH_VERSION >= (2, 6):
    from torch.nn.attention.flex_attention import flex_attention
else:
    flex_attention = None


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast runs ``device_type`` ops in, or None where autocast
    is off.

    Args:
        device_type (str): ``'cpu'``, ``'cuda'``, ...

    Returns:
        torch.dtype | None: e.g. ``torch.bfloat16`` inside
        ``torch.autocast('cpu')``.
    """
    # per-device queries take the device type from torch 2.4 on
    if TORCH_VERSION >= (2, 4):
        return torch.get_autocast_dtype(
            device_type) if torch.is_autocast_enabled(device_type) else None
    # torch 2.1 - 2.3: one query per device, without arguments
    if device_type == 'cpu':
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled(
        ) else None
    if device_type == 'cuda':
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled(
        ) else None
    return None


def is_capturing_graph() -> bool:
    """True while torch.compile or torch.export (dynamo), ``torch.jit.trace``
    or the TorchScript ONNX exporter captures a graph of the running code.

    ``torch.compiler.is_compiling`` exists from torch 2.3 on; torch 2.1 - 2.2
    have only ``torch._dynamo.is_compiling``.
    """
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return True
    if TORCH_VERSION >= (2, 3):
        return torch.compiler.is_compiling()
    return torch._dynamo.is_compiling()


def assume_constant_result(fn: Callable) -> Callable:
    """``fn`` (no arguments) called once while dynamo traces, its result a
    constant of the graph: a device query outside the traced code.
    ``torch.compiler.assume_constant_result`` from torch 2.2 on; before,
    ``torch._dynamo.assume_constant_result``."""
    if TORCH_VERSION >= (2, 2):
        return torch.compiler.assume_constant_result(fn)
    return torch._dynamo.assume_constant_result(fn)


def is_exporting() -> bool:
    """True while ``torch.export`` (and the dynamo ONNX exporter) captures a
    graph; torch.compile is not exporting. ``torch.compiler.is_exporting`` from
    torch 2.6 on, where FlexAttention (which has no export lowering) is the
    compiled kernel; before, no kernel depends on it, and this is False."""
    if TORCH_VERSION >= (2, 6):
        return torch.compiler.is_exporting()
    return False


def module_ints_constant(compiled: Callable) -> Callable:
    """``compiled`` (a ``torch.compile``-d function) tracing the int attributes
    of modules as constants, as dynamo does from torch 2.6 on
    (``allow_unspec_int_on_nn_module``, False).

    Before (torch 2.1 - 2.5), with dynamic shapes, the ints of a module whose
    bound method is compiled (heads, channels) become symbolic inputs, and
    every reshape by them becomes a sympy proof that can take minutes per
    trace. There the calls run under dynamo's ``specialize_int=True``;
    elsewhere ``compiled`` is returned as it is.
    """
    if hasattr(torch._dynamo.config, 'allow_unspec_int_on_nn_module'):
        return compiled

    @functools.wraps(compiled)
    def call(*args, **kwargs):
        with torch._dynamo.config.patch(specialize_int=True):
            return compiled(*args, **kwargs)

    return call
