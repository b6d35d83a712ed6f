"""The documentation describes the product as it is: no rounds of work or issue numbers in the
user-facing pages (history lives in CHANGELOG.md), the README's benchmark ratios are the benchmarks' own
output files, and the pictures' command writes its PNGs."""
import glob
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PAGES = sorted(
    [osp.join(ROOT, 'README.md')]
    + glob.glob(osp.join(ROOT, 'docs', '*.md'))
    + glob.glob(osp.join(ROOT, 'configs', '*', 'README.md')))
# "session(s)" as a whole word; "issue 19", "issues 11 and 19", "#19" (not in a URL or an anchor
# such as "(#detection-speed)", which has no digits right after the '#')
FORBIDDEN = {
    'session': re.compile(r'\bsessions?\b', re.IGNORECASE),
    'issue number': re.compile(r'\bissues?\s+#?\d+|(?<![\w/&])#\d+\b', re.IGNORECASE),
}
PICTURES = ('detections.png', 'attention_aa.png', 'attention_gsa.png', 'benchmark_ratios.png')


def _hits(text, pattern):
    for number, line in enumerate(text.splitlines(), 1):
        for match in pattern.finditer(line):
            yield number, match.group(0)


def test_pages_exist():
    names = {osp.relpath(p, ROOT) for p in PAGES}
    assert {'README.md', 'docs/benchmarks.md', 'docs/tests.md', 'configs/retinanet/README.md'} <= names


@pytest.mark.parametrize('kind', sorted(FORBIDDEN))
def test_no_history_words_in_pages(kind):
    found = []
    for path in PAGES:
        with open(path, encoding='utf-8') as f:
            text = f.read()
        found += [f'{osp.relpath(path, ROOT)}:{n}: {word!r}' for n, word in _hits(text, FORBIDDEN[kind])]
    assert not found, f'{kind} in the documentation (history goes to CHANGELOG.md):\n' + '\n'.join(found)


def test_no_issue_numbers_in_history_or_scripts():
    """CHANGELOG.md and what a user runs or reads (scripts' ``--help``, configs, the demo, the tests) name no issue
    of ours; this file's own examples aside."""
    paths = [osp.join(ROOT, 'CHANGELOG.md')] + [
        p for pattern in ('benchmarks/*', 'tools/**/*', 'configs/**/*.py', 'aa_det/**/*.py', 'demo/*', 'tests/*')
        for p in glob.glob(osp.join(ROOT, pattern), recursive=True)
        if p.endswith(('.py', '.sh')) and p != osp.abspath(__file__)]
    found = []
    for path in paths:
        with open(path, encoding='utf-8') as f:
            text = f.read()
        found += [f'{osp.relpath(path, ROOT)}:{n}: {word!r}' for n, word in _hits(text, FORBIDDEN['issue number'])]
    assert len(paths) > 50 and not found, 'issue numbers users cannot see:\n' + '\n'.join(found)


def test_forbidden_patterns_catch_what_they_should():
    assert list(_hits('Third Session, same counter', FORBIDDEN['session']))
    assert list(_hits('the sessions before', FORBIDDEN['session']))
    assert not list(_hits('ort.InferenceSession(path)', FORBIDDEN['session']))
    for text in ('before issue 19', 'Issue 11: not measured', 'see #19', 'issues 11'):
        assert list(_hits(text, FORBIDDEN['issue number'])), text
    for text in ('[speed](docs/benchmarks.md#detection-speed)', 'https://github.com/pytorch/pytorch/issues/172204',
                 'an issue of mmdet', 'ab&#39;s'):
        assert not list(_hits(text, FORBIDDEN['issue number'])), text


def test_every_config_a_page_names_exists():
    """A config file named in backticks on any page (``retinanet_..._coco.py``) is in configs/."""
    configs = {osp.basename(p) for p in glob.glob(osp.join(ROOT, 'configs', '*', '*.py'))}
    missing, named = [], 0
    for path in PAGES:
        with open(path, encoding='utf-8') as f:
            names = re.findall(r'`(?:configs/\w+/)?([\w.-]+_(?:coco|in1k|shapes|shapes-cls|cifar100)\.py)`', f.read())
        missing += [f'{osp.relpath(path, ROOT)}: {name}' for name in names if name not in configs]
        named += len(names)
    assert named > 20 and not missing, missing


def test_readme_is_a_front_page():
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        text = f.read()
    assert len(text.splitlines()) < 150
    for picture in PICTURES:
        assert f'docs/img/{picture}' in text, picture
        path = osp.join(ROOT, 'docs', 'img', picture)
        assert osp.isfile(path), path
        assert 0 < osp.getsize(path) < 300 * 1024, (path, osp.getsize(path))
    assert 'bash tools/make_pictures.sh' in text


def test_benchmarks_page_has_one_section_per_script():
    with open(osp.join(ROOT, 'docs', 'benchmarks.md'), encoding='utf-8') as f:
        text = f.read()
    for script in sorted(glob.glob(osp.join(ROOT, 'benchmarks', '*.py'))):
        name = osp.basename(script)
        assert re.search(rf'^## .*`{re.escape(name)}`', text, re.MULTILINE), name
        assert f'.venv/bin/python benchmarks/{name}' in text, name


#: README Results rows (their first cell starts so) and the chart row (plot_ratios.chart_rows) each shows
README_RATIO_ROWS = {'CPU time of a RetinaNet train step': 0, 'kernel launches of the CUDA path': 3,
                     'non-GEMM bytes': 4, 'peak memory': 5}


def test_readme_ratios_are_the_benchmark_files():
    """The README's ratio rows and its chart come from docs/data/*.json (plot_ratios.py draws the chart
    from the same files; make_pictures.sh runs it): the README's figures are those files' ratios."""
    sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis_tools'))
    from plot_ratios import chart_rows
    rows = chart_rows()
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        lines = f.read().splitlines()
    for start, index in README_RATIO_ROWS.items():
        line = next((l for l in lines if l.startswith(f'| {start}')), None)
        assert line is not None, start
        cells = line.split('|')[2:4]  # AA-ResNet-50, GSA-ResNet-50
        shown = [float(re.match(r'\s*(\d+\.\d+)x', cell).group(1)) for cell in cells]
        assert shown == [round(r, 2) for r in rows[index][1:]], (start, shown, rows[index])
    assert 'plot_ratios.py' in open(osp.join(ROOT, 'tools', 'make_pictures.sh')).read()


#: README GPU table rows (first cell) -> (file under docs/data, result key, ResNet-50's unit and scale)
README_GPU_ROWS = {'train step, fp16': ('detection_speed_h200_fp16.json', 'train_s', 'ms'),
                   'train step, bf16': ('detection_speed_h200_bf16.json', 'train_s', 'ms'),
                   'backbone forward + backward, fp16': ('detection_speed_h200_fp16.json', 'backbone_s', 'ms'),
                   'peak memory, train, fp16': ('detection_speed_h200_fp16.json', 'train_peak_gib', 'GiB'),
                   'inference, one 1333x800 image, fp16': ('detection_speed_h200_fp16.json', 'infer_s', 'ms')}


def test_readme_gpu_table_is_the_gpu_files():
    """The README's GPU table and its Results row are ``detection_speed.py --json`` files of the GPU run."""
    import json
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        lines = f.read().splitlines()
    for start, (name, key, unit) in README_GPU_ROWS.items():
        with open(osp.join(ROOT, 'docs', 'data', name)) as f:
            data = json.load(f)
        results = data['results']
        line = next((l for l in lines if l.startswith(f'| {start}')), None)
        assert line is not None and data['commit'] in ' '.join(lines), start
        base, aa, gsa = (cell.strip() for cell in line.split('|')[2:5])
        value = results['ResNet-50'][key] * (1000 if unit == 'ms' else 1)
        assert base == f'{value:.1f} {unit}' if unit == 'ms' else base == f'{value:.2f} {unit}', (start, base)
        for cell, model in ((aa, 'AA-ResNet-50'), (gsa, 'GSA-ResNet-50')):
            assert cell == f'{results[model][key] / results["ResNet-50"][key]:.2f}x', (start, model, cell)
    summary = next(l for l in lines if l.startswith('| GPU train step'))  # the Results row: fp16 / bf16
    steps = [json.load(open(osp.join(ROOT, 'docs', 'data', README_GPU_ROWS[f'train step, {amp}'][0])))['results']
             for amp in ('fp16', 'bf16')]
    for cell, model in zip(summary.split('|')[2:4], ('AA-ResNet-50', 'GSA-ResNet-50')):
        assert cell.strip() == ' / '.join(f'{r[model]["train_s"] / r["ResNet-50"]["train_s"]:.2f}x' for r in steps)


@pytest.mark.slow
def test_make_pictures_writes_every_png(tmp_path):
    """Trains the AA and GSA demo detectors (a few minutes on 2 cores) and draws every picture."""
    env = dict(os.environ, AA_DET_PICTURES_OUT=str(tmp_path / 'img'), AA_DET_PICTURES_WORK=str(tmp_path / 'work'))
    subprocess.run(['bash', osp.join(ROOT, 'tools', 'make_pictures.sh')], cwd=ROOT, env=env, check=True)
    for picture in PICTURES:
        path = tmp_path / 'img' / picture
        assert path.is_file(), path
        assert path.stat().st_size > 0, path
