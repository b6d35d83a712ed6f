"""Skip marks for tests that need a newer torch than the supported floor (torch
2.1), each naming the version and what needs it; the default run on the floor
stack reports them as skipped."""
import pytest
import torch

from aa_det.utils.compat import TORCH_VERSION


def requires_torch(version, what):
    """Skip unless torch >= ``version`` (``(major, minor)``); the reason names
    ``what`` needs it."""
    return pytest.mark.skipif(
        TORCH_VERSION < version,
        reason=f'{what} needs torch >= {version[0]}.{version[1]} '
        f'(found {torch.__version__})')


#: float16 matmul / einsum on the CPU (torch 2.1: "addmm_impl_cpu_" not
#: implemented for 'Half')
CPU_FP16_MATMUL = requires_torch((2, 2), 'float16 matmul on the CPU')
#: torch.autocast('cpu', dtype=torch.float16) (torch 2.1 autocasts the CPU to
#: bfloat16 only)
CPU_FP16_AUTOCAST = requires_torch((2, 4), 'float16 autocast on the CPU')
#: float16 SDPA on the CPU that keeps its logits in float32, as CUDA's fused
#: kernels do (torch 2.4's math kernel rounds them to float16: logits past 2^11
#: lose whole units; it upcasts from torch 2.5)
CPU_FP16_SDPA = requires_torch((2, 5),
                               'float16 SDPA on the CPU with float32 logits')
