"""The attention layers' device-dependent choices, made outside the traced
code.

What runs where (docs/design.md, "Device policy"):

* AA's kernel in eager mode and in a captured graph
  (:func:`aa_conv.relative_attention`, ``impl='auto'``): on CUDA FlexAttention
  with eq. (3)'s relative logits as its ``score_mod`` (torch >= 2.6, whose
  fused kernel also takes the gradients of tensors a ``score_mod`` reads), else
  the folded SDPA; on the CPU the blocked kernel in eager mode and the folded
  SDPA in a graph (FlexAttention has no CPU backward);
* GSA's compute dtype for float16 inputs (bfloat16 where the device has it) and
  the logits per chunk of its axial kernel (cache-sized on a CPU; one chunk of
  any detection map on a GPU).

:func:`device_policy` reads the device once per process: dynamo takes the CUDA
query's result as a constant (``assume_constant_result``), so a compiled
forward holds no query and breaks no graph. :func:`forced_device_policy` lets
CPU tensors take another device's choices: how the benchmarks count the CUDA
path and the tests trace it without a GPU.

Example:
    >>> import torch
    >>> device_policy(torch.device('cpu')).aa_kernel
    'blocked'
    >>> with forced_device_policy('cuda'):
    ...     device_policy(torch.device('cpu')).gsa_chunk_logits
    268435456
"""
import contextlib
from typing import Iterator, NamedTuple, Optional

import torch

from ...utils.compat import assume_constant_result, flex_attention

__all__ = [
    'DevicePolicy', 'device_policy', 'forced_device_policy',
    'HAS_FLEX_ATTENTION'
]

#: FlexAttention with gradients of the tensors a ``score_mod`` reads (torch 2.6
#: on)
HAS_FLEX_ATTENTION = flex_attention is not None


class DevicePolicy(NamedTuple):
    """The choices of one device type.

    Attributes:
        aa_kernel (str): AA's kernel in eager mode: 'flex', 'sdpa' or
            'blocked'.
        aa_graph_kernel (str): AA's kernel in a graph torch.compile captures.
        gsa_float16_dtype (torch.dtype): GSA's compute dtype for float16
            inputs.
        gsa_chunk_logits (int): logits per chunk of GSA's axial kernel.
    """
    aa_kernel: str
    aa_graph_kernel: str
    gsa_float16_dtype: torch.dtype
    gsa_chunk_logits: int


#: 16 MiB of float32 logits per block or chunk: cache-sized on a CPU
CPU_POLICY = DevicePolicy('blocked', 'sdpa', torch.bfloat16, 1 << 22)
_forced: Optional[str] = None


@assume_constant_result
def _cuda_has_bf16() -> bool:
    """The GPU computes in bfloat16 (Ampere on); a CUDA policy forced where
    there is none: yes."""
    return not torch.cuda.is_available() or torch.cuda.is_bf16_supported()


# FlexAttention's fused kernel or the fused SDPA; GSA's 1 << 28 logits:
# every-stage GSA-ResNet's 160x160 maps at batch 8 in one chunk (half a GiB in
# bfloat16)
_CUDA_KERNEL = 'flex' if HAS_FLEX_ATTENTION else 'sdpa'
CUDA_POLICY = DevicePolicy(_CUDA_KERNEL, _CUDA_KERNEL, torch.bfloat16, 1 << 28)
# GPUs before Ampere
CUDA_POLICY_WITHOUT_BF16 = CUDA_POLICY._replace(
    gsa_float16_dtype=torch.float32)


def device_policy(device: torch.device) -> DevicePolicy:
    """The choices for tensors on ``device`` (or those of the forced device
    type)."""
    kind = _forced or device.type
    if kind == 'cuda':
        return CUDA_POLICY if _cuda_has_bf16() else CUDA_POLICY_WITHOUT_BF16
    return CPU_POLICY


@contextlib.contextmanager
def forced_device_policy(device_type: str) -> Iterator[None]:
    """Tensors on any device take ``device_type``'s choices (on a machine
    without CUDA, a GPU's with bfloat16).

    Args:
        device_type (str): 'cuda' or 'cpu'.
    """
    global _forced
    previous, _forced = _forced, device_type
    try:
        yield
    finally:
        _forced = previous
