"""The summary of one ``benchmarks/gpu_check.sh`` call: a markdown table of
every speed step (one model in one setting) under a line for the CUDA tests
(and one per failed test), then the attention kernels' table, from the call's
work folder (``device.txt``, ``steps.tsv``, ``<step>.json`` of
``detection_speed.py``, ``kernels.json`` of ``attention_kernels.py``,
``<step>.log``); without ``--md`` the markdown goes to stdout.

    python benchmarks/gpu_check_summary.py WORK --elapsed SECONDS \\
        --md summary.md --json summary.json
    tar -xzf gpu_check.tar.gz && python benchmarks/gpu_check_summary.py \\
        gpu_check  # again, from the archive

Columns: the model, the autocast dtype, eager or compiled backbone, whose
layers (this checkout's commit or the baseline's), the median train step and
its ratio to ResNet-50's in the same setting (this checkout's eager ResNet-50
for the baseline), the backbone's forward + backward and an inference (ms and
ratio), kernels per train step and the GPU's busy fraction (``torch.profiler``,
CUDA only), the train step's peak memory (GiB; RSS growth on the CPU), compile
seconds (first step minus a timed one) and dynamo's graphs / graph breaks /
recompilations / inductor's CUDA-graph skips, and the step's status. Needs no
torch.
"""
import argparse
import json
import os.path as osp
import re

COLUMNS = ('model', 'dtype', 'backbone', 'layers', 'step ms', 'x R50',
           'backbone f+b ms', 'infer ms', 'kernels/step', 'busy', 'peak GiB',
           'compile s', 'graphs/breaks/recompiles/cg skips', 'status')


def _read_steps(work):
    """``steps.tsv``'s lines as dicts: name, kind, status, seconds, estimate; a
    speed step's name also gives its mode, dtype, layers and model
    (``<mode>_<dtype>_<layers>_<model>``)."""
    steps = []
    if not osp.exists(osp.join(work, 'steps.tsv')):  # no step run
        return steps
    with open(osp.join(work, 'steps.tsv')) as f:
        for line in f:
            name, kind, status, seconds, estimate = line.rstrip('\n').split(
                '\t')
            step = dict(
                name=name,
                kind=kind,
                status=status,
                seconds=int(seconds),
                estimate=int(estimate))
            if kind in ('eager', 'compiled'):
                step.update(
                    zip(('mode', 'dtype', 'layers', 'model'),
                        name.split('_', 3)))
            steps.append(step)
    return steps


def _error_line(text):
    """The line of ``text`` (a traceback's tail) that names the error: the last
    ``SomeError: ...`` line, else the last line; at most 120 characters."""
    lines = [
        line.strip() for line in text.strip().splitlines() if line.strip()
    ]
    errors = [
        line for line in lines
        if re.match(r'^[\w.]*(Error|Exception|Unsupported)\b', line)
    ]
    line = (errors or lines or ['?'])[-1]
    return line if len(line) <= 120 else line[:117] + '...'


def _log_tail(work, name):
    path = osp.join(work, f'{name}.log')
    if not osp.exists(path):
        return ''
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-40:])


def _speed_row(work, step):
    """One speed step's row: its figures (None where not measured) and
    status."""
    row = dict(
        model=step['model'],
        dtype=step['dtype'],
        backbone=step['mode'],
        layers=step['layers'],
        step=step['name'],
        status=step['status'],
        error=None)
    path = osp.join(work, f'{step["name"]}.json')
    data = {}
    if osp.exists(path):
        with open(path) as f:
            data = json.load(f)
    row.update(data.get('results', {}).get(step['model'], {}))
    errors = data.get('failed', {}).get(step['model'])
    # a timeout's log ends wherever it was cut
    if step['status'].startswith('failed'):
        row['error'] = _error_line(
            errors[-1] if errors else _log_tail(work, step['name']))
    return row


def _tests(work, steps):
    """The test step's status, pytest's closing line and its failed tests."""
    step = next((s for s in steps if s['name'] == 'tests'), None)
    if step is None:
        return dict(status='not run', line='', failed=[])
    log = _log_tail(work, 'tests')
    totals = [
        line.strip(' =') for line in log.splitlines() if re.search(
            r'\b(passed|failed|skipped|deselected|error|errors|no tests '
            r'ran)\b', line) and re.search(r'\bin [\d.]+s\b', line)
    ]
    failed = [
        line.strip() for line in log.splitlines()
        if line.startswith(('FAILED', 'ERROR'))
    ]
    # pytest did not get to its closing line
    if not totals and step['status'].startswith('failed'):
        totals = [_error_line(log)]
    return dict(
        status=step['status'],
        seconds=step['seconds'],
        line=totals[-1] if totals else '',
        failed=failed)


def _kernels(work):
    """``attention_kernels.py``'s settings and cases, or None (not run)."""
    path = osp.join(work, 'kernels.json')
    if not osp.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _kernel_lines(kernels):
    """The attention kernels' table: each case's ms, GiB and ratio to the
    first case's time."""
    s = kernels['settings']
    conv = f'; conv: {s["conv"]} -> {s["conv"]} 3x3' if s['conv'] else ''
    lines = [
        '', f'Attention kernels (attention_kernels.py), forward + backward, '
        f'{s["dtype"]}, {s["num_heads"]} heads, dkh {s["key_dim"]}, dvh '
        f'{s["value_dim"]}{conv}', '',
        '| map | batch | kernel | ms | GiB | x first | status |',
        '|---|---|---|---|---|---|---|'
    ]
    first = {}
    for r in kernels['results']:
        base = first.setdefault((r['side'], r['batch']), r)
        ratio = (f'{r["time_s"] / base["time_s"]:.2f}'
                 if r.get('time_s') and base.get('time_s') else '-')
        lines.append(f'| {r["side"]}x{r["side"]} | {r["batch"]} | '
                     f'{r["case"]} | {_fmt(r.get("time_s"), ".2f", 1000)} | '
                     f'{_fmt(r.get("peak_gib"), ".2f")} | {ratio} | '
                     f'{r["status"].replace("|", "/")} |')
    return lines


def _fmt(value, form, scale=1.0):
    return '-' if value is None else format(value * scale, form)


def _cells(row, base):
    """The table's cells of ``row``; ratios to ``base`` (ResNet-50's row in the
    same setting) where it has one."""

    def timed(key):
        if row.get(key) is None:
            return '-'
        ratio = f' ({row[key] / base[key]:.2f}x)' if base and base.get(
            key) else ''
        return f'{row[key] * 1000:.1f}{ratio}'

    counts = [
        row.get(k)
        for k in ('graphs', 'graph_breaks', 'recompiles', 'cudagraph_skips')
    ]
    status = (
        row['status'] + (f': {row["error"]}' if row['error'] else '') +
        (f' (profile failed: {row["profile_error"]})'
         if row.get('profile_error') else ''))
    return [
        row['model'], {
            'float16': 'fp16',
            'bfloat16': 'bf16'
        }.get(row['dtype'], row['dtype']), row['backbone'], row['layer_name'],
        _fmt(row.get('train_s'), '.1f',
             1000), f'{row["train_s"] / base["train_s"]:.2f}'
        if base and base.get('train_s') and row.get('train_s') else '-',
        timed('backbone_s'),
        timed('infer_s'),
        _fmt(row.get('kernels_per_step'), ',.0f'),
        _fmt(row.get('busy'), '.2f'),
        _fmt(row.get('train_peak_gib'), '.2f'),
        _fmt(row.get('compile_s'), '.0f'),
        '/'.join(str(c) for c in counts) if any(c is not None
                                                for c in counts) else '-',
        status.replace('|', '/').replace('\n', ' ')
    ]


def summarize(work, elapsed=None):
    """The summary as a dict (device, tests, rows, steps) and as markdown text;
    ``elapsed`` (the call's seconds) by default from the work folder's
    ``summary.json`` of an earlier summary."""
    if elapsed is None and osp.exists(osp.join(work, 'summary.json')):
        with open(osp.join(work, 'summary.json')) as f:
            elapsed = json.load(f).get('elapsed_s')
    device = {}
    if osp.exists(osp.join(work, 'device.txt')):
        with open(osp.join(work, 'device.txt')) as f:
            device = dict(
                line.rstrip('\n').split('=', 1) for line in f if '=' in line)
    steps = _read_steps(work)
    tests = _tests(work, steps)
    rows = [_speed_row(work, s) for s in steps if 'model' in s]
    names = dict(
        current=device.get('commit', 'current'),
        baseline=device.get('baseline', 'baseline'))
    for row in rows:
        row['layer_name'] = names[row['layers']]
    by_setting = {(r['backbone'], r['dtype'], r['layers'], r['model']): r
                  for r in rows}

    ok = sum(s['status'] == 'ok' for s in steps)
    skipped = sum(s['status'].startswith('skipped') for s in steps)
    used = '?' if elapsed is None else elapsed
    lines = [
        f'## gpu_check: {device.get("device_name", "?")}, torch '
        f'{device.get("torch", "?")}, {names["current"]} beside '
        f'{names["baseline"]}', '',
        f'{device.get("size", "?")} px crops; compile: '
        f'{device.get("compile", "?")}; deadline '
        f'{device.get("deadline_s", "?")} s, used {used} s; steps: {ok} ok, '
        f'{skipped} skipped, {len(steps) - ok - skipped} failed or timed out',
        '', f'CUDA tests (pytest -m cuda): {tests["status"]}' +
        (f', {tests["line"]}' if tests['line'] else '')
    ]
    lines += [f'- {line}' for line in tests['failed'][:8]]
    lines += [
        '', '| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)
    ]
    for row in rows:
        base = by_setting.get(
            (row['backbone'], row['dtype'], 'current', 'ResNet-50'))
        if row['layers'] == 'baseline':
            base = by_setting.get(
                ('eager', row['dtype'], 'current', 'ResNet-50'))
        if base is not None and base.get('train_s') is None:
            base = None
        lines.append('| ' + ' | '.join(_cells(row, base)) + ' |')
    kernels = _kernels(work)
    if kernels:
        lines += _kernel_lines(kernels)
    summary = dict(
        device=device,
        elapsed_s=elapsed,
        tests=tests,
        rows=rows,
        kernels=kernels,
        steps=steps)
    return summary, '\n'.join(lines) + '\n'


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'work', help="the call's work folder (OUTDIR/gpu_check)")
    parser.add_argument(
        '--elapsed', type=int, help="the call's seconds so far")
    parser.add_argument('--md', help='write the markdown here')
    parser.add_argument('--json', help='write the summary as JSON here')
    args = parser.parse_args()
    summary, text = summarize(args.work, args.elapsed)
    if args.md:
        with open(args.md, 'w') as f:
            f.write(text)
    else:
        print(text, end='')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(summary, f, indent=1)


if __name__ == '__main__':
    main()
