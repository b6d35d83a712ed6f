"""Time and peak memory of one AA attention forward+backward: naive vs real
path.

The naive form is the AA paper's (all B*Nh*(HW)^2 logits at once, appendix
A.3); the real path is what AAConv2d runs (`impl='auto'`: blocked on the CPU,
folded fused SDPA on CUDA). Nh = 8, dkh = dvh = 20. Each case runs in its own
process so that peak RSS (CPU) is that case's alone; on CUDA,
torch.cuda.max_memory_allocated.

    .venv/bin/python benchmarks/attention_memory.py            # CPU
    .venv/bin/python benchmarks/attention_memory.py --device cuda
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

SIDES = (20, 40, 80, 128)
# the naive form holds logits, softmax and a gradient of that size at once
NAIVE_COPIES = 3


def memory_gib(device):
    """Memory the cases may use: the GPU's, or the machine's RAM."""
    if device == 'cuda':
        import torch
        return torch.cuda.mem_get_info()[1] / 2**30
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30


def run_case(side, batch, impl, device, repeats):
    import torch

    from aa_det.models.layers import relative_attention
    Nh, d, N = 8, 20, side * side
    torch.manual_seed(0)

    def make():
        return [
            torch.randn(batch, Nh, N, d, device=device, requires_grad=True)
            for _ in range(3)
        ]

    tables = [
        torch.randn(2 * 64 - 1, d, device=device, requires_grad=True)
        for _ in range(2)
    ]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    times = []
    # small cases: more repeats
    while len(times) < repeats or (sum(times) < 2.0 and len(times) < 50):
        q, k, v = make()
        if device == 'cuda':
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = relative_attention(q, k, v, *tables, side, side, impl=impl)
        out.square().sum().backward()
        if device == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if device == 'cuda':
        peak = (torch.cuda.max_memory_allocated() - base_cuda) / 2**30
    else:
        # KiB -> GiB
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss -
                base) / 2**20
    return dict(time_s=min(times), peak_gib=peak)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--sides', type=int, nargs='+', default=SIDES)
    parser.add_argument('--batches', type=int, nargs='+', default=(1, 2))
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--case', nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        side, batch, impl = int(args.case[0]), int(args.case[1]), args.case[2]
        print(
            json.dumps(run_case(side, batch, impl, args.device, args.repeats)))
        return
    naive_limit = memory_gib(args.device) / NAIVE_COPIES
    print(
        f'device={args.device}  Nh=8 dkh=20  (fwd+bwd of the attention; peak '
        f'= memory above start; naive skipped when its logits exceed '
        f'{naive_limit:.1f} GiB)')
    print(f'{"HW":>10} {"B":>2} {"naive logits":>13} | {"naive s":>8} '
          f'{"naive GiB":>9} | {"real s":>8} {"real GiB":>8} | '
          f'{"naive/real time":>15}')
    for side in args.sides:
        for batch in args.batches:
            logits_gib = batch * 8 * (side * side)**2 * 4 / 2**30
            res = {}
            for impl in ('materialized', 'auto'):
                if impl == 'materialized' and logits_gib > naive_limit:
                    res[impl] = None
                    continue
                cmd = [
                    sys.executable, __file__, '--device', args.device,
                    '--repeats',
                    str(args.repeats), '--case',
                    str(side),
                    str(batch), impl
                ]
                out = subprocess.run(cmd, capture_output=True, text=True)
                res[impl] = json.loads(out.stdout.strip().splitlines()
                                       [-1]) if out.returncode == 0 else None
            naive, real = res['materialized'], res['auto']
            n_s = (f'{naive["time_s"]:8.3f} {naive["peak_gib"]:9.2f}'
                   if naive else f'{"skipped":>8}'
                   f' '
                   f'{"-":>9}')
            ratio = (f'{naive["time_s"] / real["time_s"]:15.2f}'
                     if naive and real else f'{"-":>15}')
            r_s = (f'{real["time_s"]:8.3f} {real["peak_gib"]:8.2f}'
                   if real else f'{"failed":>8}'
                   f' '
                   f'{"-":>8}')
            print(
                f'{side}x{side:<6} {batch:>2} {logits_gib:10.2f} GiB | {n_s} '
                f'| {r_s} | {ratio}',
                flush=True)


if __name__ == '__main__':
    main()
