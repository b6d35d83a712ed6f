"""Time and peak memory of one AA attention forward + backward, per kernel.

:func:`aa_det.models.layers.relative_attention` (eq. (3)) with each ``impl``
of ``--impls``: ``Nh = 8`` heads of ``dkh = 20`` key channels (AA-ResNet-50's)
and ``--value-dim`` value channels per head (AA-ResNet-50's are 2, 3 and 6),
at square maps (``--sides``) and ``--batches``. ``auto`` is the device's
kernel (the CPU's ``blocked``, CUDA's ``flex``); a kernel followed by
``:none`` runs without the relative logits (FlexAttention without its
``score_mod``, plain SDPA), so the two show what the position term costs.
``--conv C`` adds a ``C -> C`` 3x3 convolution at the same map and batch: the
layer an AA conv augments. Each case runs in its own process, so that its peak
memory (RSS growth on the CPU, ``max_memory_allocated`` on CUDA) is its own;
its time is the fastest of at least ``--repeats`` calls (and 0.5 s) after an
untimed one (FlexAttention compiles there). ``materialized`` is skipped where
its logits would not fit in a third of the memory.

    .venv/bin/python benchmarks/attention_kernels.py          # CPU, 3.5 min
    python benchmarks/attention_kernels.py --device cuda --sides 40 \\
        --batches 8 --value-dim 3 --dtype bfloat16 --conv 256 \\
        --impls flex flex:none sdpa sdpa:none materialized

(the second: stage 3 of AA-ResNet-50 at 640x640 batch 8, as
``benchmarks/gpu_check.sh`` runs it).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

SIDES = (20, 40, 80, 128)
NUM_HEADS, KEY_DIM = 8, 20
# the naive form holds logits, softmax and a gradient of that size at once
NAIVE_COPIES = 3


def memory_gib(device):
    """Memory the cases may use: the GPU's, or the machine's RAM."""
    if device == 'cuda':
        import torch
        return torch.cuda.mem_get_info()[1] / 2**30
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30


def logits_gib(side, batch):
    """The float32 logits the naive form holds: ``B * Nh * (HW)^2``."""
    return batch * NUM_HEADS * (side * side)**2 * 4 / 2**30


def case_step(side, batch, case, value_dim, conv, device, dtype):
    """A function running one forward + backward of ``case`` on new inputs."""
    import torch
    import torch.nn.functional as F

    from aa_det.models.layers import relative_attention
    if case == 'conv':
        weight = torch.randn(
            conv, conv, 3, 3, device=device, dtype=dtype, requires_grad=True)

        def step():
            x = torch.randn(
                batch,
                conv,
                side,
                side,
                device=device,
                dtype=dtype,
                requires_grad=True)
            F.conv2d(x, weight, padding=1).float().square().sum().backward()

        return step
    impl, _, position = case.partition(':')
    # parameters stay float32, as under autocast
    tables = [
        torch.randn(2 * 64 - 1, KEY_DIM, device=device, requires_grad=True)
        for _ in range(2)
    ] if position != 'none' else [None, None]

    def step():
        q, k, v = (
            torch.randn(
                batch,
                NUM_HEADS,
                side * side,
                dim,
                device=device,
                dtype=dtype,
                requires_grad=True) for dim in (KEY_DIM, KEY_DIM, value_dim))
        out = relative_attention(
            q, k, v, *tables, side, side, impl=impl, scale=KEY_DIM**-0.5)
        out.float().square().sum().backward()

    return step


def run_case(side, batch, case, value_dim, conv, device, dtype, repeats):
    """Seconds (the fastest call) and peak GiB above the start of ``case``."""
    import torch
    dtype = getattr(torch, dtype)
    torch.manual_seed(0)
    step = case_step(side, batch, case, value_dim, conv, device, dtype)

    def sync():
        if device == 'cuda':
            torch.cuda.synchronize()

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    step()  # untimed: compiles, allocates
    sync()
    times = []
    while len(times) < repeats or (sum(times) < 0.5 and len(times) < 50):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    if device == 'cuda':
        peak = (torch.cuda.max_memory_allocated() - base_cuda) / 2**30
    else:  # KiB -> GiB
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss -
                base) / 2**20
    return dict(time_s=min(times), peak_gib=peak)


def write_json(args, results):
    settings = {k: v for k, v in vars(args).items() if k != 'json'}
    settings.update(num_heads=NUM_HEADS, key_dim=KEY_DIM)
    with open(args.json, 'w') as f:
        json.dump(
            dict(
                benchmark='attention_kernels',
                settings=settings,
                results=results),
            f,
            indent=1)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument(
        '--impls',
        nargs='+',
        default=['materialized', 'auto'],
        help="relative_attention's kernels, each optionally ':none' "
        '(without the relative logits); the first is the ratios\' base')
    parser.add_argument('--sides', type=int, nargs='+', default=SIDES)
    parser.add_argument('--batches', type=int, nargs='+', default=(1, 2))
    parser.add_argument(
        '--value-dim', type=int, default=20, help='value channels per head')
    parser.add_argument(
        '--dtype',
        default='float32',
        choices=['float32', 'bfloat16', 'float16'],
        help='of q, k and v (the tables stay float32)')
    parser.add_argument(
        '--conv',
        type=int,
        default=0,
        help='also time a C -> C 3x3 convolution (0: none)')
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--json', help='write the cases here')
    parser.add_argument('--case', nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        side, batch, case = int(args.case[0]), int(args.case[1]), args.case[2]
        print(
            json.dumps(
                run_case(side, batch, case, args.value_dim, args.conv,
                         args.device, args.dtype, args.repeats)))
        return
    naive_limit = memory_gib(args.device) / NAIVE_COPIES
    cases = list(args.impls) + (['conv'] if args.conv else [])
    print(f'device={args.device} dtype={args.dtype} Nh={NUM_HEADS} '
          f'dkh={KEY_DIM} dvh={args.value_dim}' +
          (f' conv={args.conv}x{args.conv}' if args.conv else '') +
          f'; forward + backward; GiB = peak above the start; materialized '
          f'skipped where its logits exceed {naive_limit:.1f} GiB')
    print(f'{"HW":>9} {"B":>3} {"logits GiB":>10} | {"kernel":<18} '
          f'{"s":>9} {"GiB":>7} {"x first":>8}')
    results = []
    for side in args.sides:
        for batch in args.batches:
            first = None
            for case in cases:
                row = dict(side=side, batch=batch, case=case)
                if case.startswith('materialized') and logits_gib(
                        side, batch) > naive_limit:
                    row['status'] = 'skipped: memory'
                else:
                    cmd = [
                        sys.executable, __file__, '--device', args.device,
                        '--dtype', args.dtype, '--value-dim',
                        str(args.value_dim), '--conv',
                        str(args.conv), '--repeats',
                        str(args.repeats), '--case',
                        str(side),
                        str(batch), case
                    ]
                    out = subprocess.run(cmd, capture_output=True, text=True)
                    if out.returncode == 0:
                        row.update(json.loads(out.stdout.splitlines()[-1]))
                        row['status'] = 'ok'
                    else:
                        lines = out.stderr.strip().splitlines() or ['?']
                        row['status'] = f'failed: {lines[-1][:100]}'
                results.append(row)
                if args.json:  # after each case: a run cut short keeps them
                    write_json(args, results)
                first = row if first is None else first
                if row['status'] == 'ok':
                    ratio = (f'{row["time_s"] / first["time_s"]:8.2f}'
                             if first.get('time_s') else f'{"-":>8}')
                    figures = (f'{row["time_s"]:9.4f} {row["peak_gib"]:7.2f} '
                               f'{ratio}')
                else:
                    figures = row['status']
                print(
                    f'{side}x{side:<6} {batch:>3} '
                    f'{logits_gib(side, batch):10.2f} | {case:<18} {figures}',
                    flush=True)
    # a case that failed is the run's failure (gpu_check reports it)
    sys.exit(any(r['status'].startswith('failed') for r in results))


if __name__ == '__main__':
    main()
