"""The documentation shows what the commands print: the figures the README and
docs/benchmarks.md show are the benchmarks' own output files
(docs/data/*.json), every benchmark's command is named, every config a page
names exists, the pictures' command writes its PNGs, and the messages the docs
quote are the code's."""
import glob
import json
import os
import os.path as osp
import re
import statistics
import subprocess
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PAGES = sorted([osp.join(ROOT, 'README.md')] +
               glob.glob(osp.join(ROOT, 'docs', '*.md')) +
               glob.glob(osp.join(ROOT, 'configs', '*', 'README.md')))
PICTURES = ('detections.png', 'attention_aa.png', 'attention_gsa.png',
            'benchmark_ratios.png')


def test_pages_exist():
    names = {osp.relpath(p, ROOT) for p in PAGES}
    assert {
        'README.md', 'docs/benchmarks.md', 'docs/tests.md',
        'configs/retinanet/README.md'
    } <= names


def _package_configs(package):
    """The config file names an installed OpenMMLab package ships
    (``mmdet/.mim/configs``), none if it is absent."""
    import importlib.util
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return set()
    root = osp.join(
        list(spec.submodule_search_locations)[0], '.mim', 'configs')
    return {
        osp.basename(p)
        for p in glob.glob(osp.join(root, '**', '*.py'), recursive=True)
    }


def test_every_config_a_page_names_exists():
    """A config file named in backticks on any page (``retinanet_..._coco.py``)
    is in configs/ or is one of the installed mmdet's or mmpretrain's own
    configs."""
    configs = {
        osp.basename(p)
        for p in glob.glob(osp.join(ROOT, 'configs', '*', '*.py'))
    }
    configs |= _package_configs('mmdet') | _package_configs('mmpretrain')
    missing, named = [], 0
    for path in PAGES:
        with open(path, encoding='utf-8') as f:
            names = re.findall(
                r'`(?:configs/\w+/)?([\w.-]+_(?:coco|in1k|shapes|shapes-cls|'
                r'cifar100)\.py)`', f.read())
        missing += [
            f'{osp.relpath(path, ROOT)}: {name}' for name in names
            if name not in configs
        ]
        named += len(names)
    assert named > 20 and not missing, missing


def test_readme_names_the_pictures_and_their_command():
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        text = f.read()
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
        assert re.search(rf'^## .*`{re.escape(name)}`', text,
                         re.MULTILINE), name
        assert f'.venv/bin/python benchmarks/{name}' in text, name


def _data(name):
    with open(osp.join(ROOT, 'docs', 'data', name)) as f:
        return json.load(f)


def _lines(*path):
    with open(osp.join(ROOT, *path), encoding='utf-8') as f:
        return f.read().splitlines()


def _row(lines, start):
    """The cells of the table row whose first cell starts with ``start``."""
    line = next((row for row in lines if row.startswith(f'| {start}')), None)
    assert line is not None, start
    return [cell.strip() for cell in line.strip().strip('|').split('|')]


def _ratio(results, model, key):
    return f'{results[model][key] / results["ResNet-50"][key]:.2f}x'


#: README Results rows (their first cell starts so) -> (file under docs/data,
#: result key)
README_RATIO_ROWS = {
    'kernel launches of the CUDA path': ('op_counts.json', 'ops'),
    'FLOPs': ('op_counts.json', 'flops'),
    'non-GEMM bytes': ('op_counts.json', 'bytes'),
    'peak memory': ('op_counts.json', 'peak'),
    'CPU time of a RetinaNet train step':
    ('detection_speed_cpu.json', 'train_s')
}
EVERY_STAGE = 'GSA-ResNet-50, all stages'


def test_readme_ratios_are_the_benchmark_files():
    """The README's ratio rows are docs/data/*.json's ratios to ResNet-50 (AA
    cell, GSA cell and the GSA cell's "every stage" figure), the line under the
    table names each file's commit, and the chart (plot_ratios.py, run by
    make_pictures.sh) draws the same ratios."""
    lines = _lines('README.md')
    for start, (name, key) in README_RATIO_ROWS.items():
        data = _data(name)
        results = data['results'] if 'results' in data else next(
            iter(data['results_by_batch'].values()))
        aa, gsa = _row(lines, start)[1:3]
        assert aa == _ratio(results, 'AA-ResNet-50', key), (start, aa)
        assert gsa.split(' ')[0] == _ratio(results, 'GSA-ResNet-50',
                                           key), (start, gsa)
        every = re.search(r'every stage: (\S+)\)', gsa)
        assert every is None or every.group(1) == _ratio(
            results, EVERY_STAGE, key), (start, gsa)
        assert data['commit'] in ' '.join(lines), (name, data['commit'])
    sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis_tools'))
    from plot_ratios import chart_rows
    shown = {
        start: [float(c.split('x')[0]) for c in _row(lines, start)[1:3]]
        for start in README_RATIO_ROWS
    }
    for index, start in ((0, 'CPU time of a RetinaNet train step'),
                         (3, 'kernel launches of the CUDA path'),
                         (4, 'non-GEMM bytes'), (5, 'peak memory')):
        assert shown[start] == [round(r, 2)
                                for r in chart_rows()[index][1:]], start
    assert 'plot_ratios.py' in open(
        osp.join(ROOT, 'tools', 'make_pictures.sh')).read()


def test_readme_and_benchmarks_memory_are_backbone_memory_json():
    """The README's backbone-memory row and docs/benchmarks.md's table are
    ``backbone_memory.py``'s file: live peaks and RSS medians as ratios to
    ResNet-50 with the same ``with_cp``."""
    data = _data('backbone_memory.json')
    live, rss = data['live_gib'], {
        w: {m: statistics.median(r)
            for m, r in runs.items()}
        for w, runs in data['rss_gib'].items()
    }

    def ratios(table, model):
        return ' / '.join(f'{table[w][model] / table[w]["ResNet-50"]:.2f}x'
                          for w in ('False', 'True'))

    aa, gsa = _row(
        _lines('README.md'), 'peak memory, backbone forward + backward')[1:3]
    assert (aa == f'{ratios(live, "AA-ResNet-50")}; '
            f'{ratios(rss, "AA-ResNet-50")}'), aa
    assert (gsa == f'every stage: {ratios(live, "GSA-ResNet-50")}; '
            f'{ratios(rss, "GSA-ResNet-50")}'), gsa
    text = '\n'.join(_lines('docs', 'benchmarks.md'))
    for model in ('AA-ResNet-50', 'GSA-ResNet-50'):
        for w in ('False', 'True'):
            runs = data['rss_gib'][w][model]
            assert (f'{live[w][model]:.2f} '
                    f'({live[w][model] / live[w]["ResNet-50"]:.2f}x)'
                    in text), (model, w)
            assert (f'{rss[w][model]:.2f} ({min(runs):.2f}-{max(runs):.2f}, '
                    f'{rss[w][model] / rss[w]["ResNet-50"]:.2f}x)') in text, (
                        model, w)
    assert data['commit'] in text and data['commit'] in ' '.join(
        _lines('README.md'))


#: the README's backbone benchmark row: label before each "val / val_2x" pair
#: -> docs/data/backbone_benchmark.json key
README_BACKBONES = {
    'ResNet-18': 'ResNet-18',
    "ResNet-26 of GSA-ResNet-26's shape": 'ResNet-26 (GSA shape)',
    'AA-ResNet-18': 'AA-ResNet-18',
    'GSA-ResNet-26, stages 3-4': 'GSA-ResNet-26',
    'stages 2-4': 'GSA-ResNet-26, stages 2-4',
    'every stage': 'GSA-ResNet-26, all stages'
}


def _backbone_summaries():
    """``{key: (val, val_2x)}``, each as ``backbone_benchmark.py`` prints it
    (mean +- stdev (min-max))."""

    def summary(values):
        return (f'{statistics.mean(values):.3f} +- '
                f'{statistics.stdev(values):.3f} '
                f'({min(values):.3f}-{max(values):.3f})')

    return {
        key: tuple(
            summary([run[split] for run in runs])
            for split in ('val', 'val_2x'))
        for key, runs in _data('backbone_benchmark.json')['results'].items()
    }


def test_readme_backbone_benchmark_is_its_file():
    line = ' | '.join(
        _row(
            _lines('README.md'),
            'shapes of 10 classes over held-out photographs'))
    summaries = _backbone_summaries()
    for label, key in README_BACKBONES.items():
        found = re.search(
            rf'(?<![\w-]){re.escape(label)}:? (\d\.\d{{3}}) / (\d\.\d{{3}})',
            line)
        assert found, label
        assert found.groups() == tuple(
            s.split(' ')[0]
            for s in summaries[key]), (label, found.groups(), summaries[key])


def test_benchmarks_page_tables_are_the_data_files():
    """docs/benchmarks.md's tables of op_counts.py, detection_speed.py (CPU and
    GPU) and backbone_benchmark.py show docs/data/*.json's figures."""
    lines = _lines('docs', 'benchmarks.md')
    text = '\n'.join(lines)
    counts = _data('op_counts.json')
    results = next(iter(counts['results_by_batch'].values()))
    base = results['ResNet-50']
    for model, r in results.items():
        if model == 'ResNet-50':
            continue
        cells = [
            f'{r[key] / scale:{form}} ({r[key] / base[key]:.2f}x)'
            for key, scale, form in (('ops', 1, '.0f'), ('flops', 1e9, '.1f'),
                                     ('bytes', 2**30, '.2f'), ('peak', 2**30,
                                                               '.2f'))
        ]
        assert any(all(c in line for c in cells)
                   for line in lines), (model, cells)
    assert counts['commit'] in text
    for name in ('detection_speed_cpu.json', 'detection_speed_h200_fp16.json',
                 'detection_speed_h200_bf16.json'):
        data = _data(name)
        timed = data['results']
        for model in ('AA-ResNet-50', 'GSA-ResNet-50'):
            if name == 'detection_speed_cpu.json':
                cells = ' | '.join(
                    _ratio(timed, model, key)
                    for key in ('train_s', 'backbone_s', 'infer_s'))
            else:
                cells = (f'{timed[model]["train_s"] * 1000:.1f} ms '
                         f'({_ratio(timed, model, "train_s")})')
            assert cells in text, (name, model, cells)
        assert data['commit'] in text, name
    for key, (val, val_2x) in _backbone_summaries().items():
        assert any(val in line and val_2x in line
                   for line in lines), (key, val, val_2x)


@pytest.mark.slow
def test_make_pictures_writes_every_png(tmp_path):
    """Trains the AA and GSA demo detectors (a few minutes on 2 cores) and
    draws every picture."""
    env = dict(
        os.environ,
        AA_DET_PICTURES_OUT=str(tmp_path / 'img'),
        AA_DET_PICTURES_WORK=str(tmp_path / 'work'))
    subprocess.run(
        ['bash', osp.join(ROOT, 'tools', 'make_pictures.sh')],
        cwd=ROOT,
        env=env,
        check=True)
    for picture in PICTURES:
        path = tmp_path / 'img' / picture
        assert path.is_file(), path
        assert path.stat().st_size > 0, path


def test_demo_model_parameters_in_the_docs_are_the_models():
    """docs/detection.md's parameter count of the demo detector (what mmdet's
    get_flops.py prints) is the built model's."""
    # isort: off
    import aa_det  # noqa: F401
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    # isort: on
    with open(osp.join(ROOT, 'docs', 'detection.md'), encoding='utf-8') as f:
        figure = re.search(
            r'`get_flops` of the demo model: [\d.]+ GFLOPs at 128x128, '
            r'([\d.]+)M parameters', f.read())
    init_default_scope('mmdet')
    config = osp.join(ROOT, 'configs', 'retinanet',
                      'retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py')
    model = MODELS.build(Config.fromfile(config).model)
    assert figure and figure.group(
        1) == f'{sum(p.numel() for p in model.parameters()) / 1e6:.3f}'


def _doc_spans(page: str, *starts: str):
    """The code spans of ``page`` (joined across lines) that begin with one of
    ``starts``."""
    with open(osp.join(ROOT, page), encoding='utf-8') as f:
        # code blocks
        text = re.sub(
            r'^```.*?^```', '', f.read(), flags=re.DOTALL | re.MULTILINE)
    spans = [
        re.sub(r'\s*\n\s*', ' ', span)
        for span in re.findall(r'`([^`]+)`', text)
    ]
    return [span for span in spans if span.startswith(starts)]


def _span_pattern(span: str) -> str:
    """A docs span as a pattern: ``...`` (abridged) matches anything, ``FILE``
    a path."""
    return '.*'.join(
        re.escape(part).replace('FILE', r'\S+') for part in span.split('...'))


def test_backbone_messages_in_the_docs_are_what_the_backbones_print(
        tmp_path, monkeypatch):
    """docs/detection.md's lines of the backbones' check of weights nothing
    loaded, each what AA-ResNet-50 with mmdet ResNet-50's settings
    (``frozen_stages=1``, ``norm_eval=True``) prints: nothing loaded (the
    hooks' refusal, the backbone's warning), a ResNet-50 checkpoint
    (torchvision's keys; docs: its URL) and an mmpretrain classifier's
    checkpoint without ``prefix='backbone.'``."""
    import torch
    from mmdet.registry import MODELS

    import aa_det  # noqa: F401
    from aa_det.models.backbones import unloaded_weights
    logged = []
    monkeypatch.setattr(
        unloaded_weights,
        'print_log',
        lambda msg, logger=None, level=None: logged.append(msg))

    def backbone(type_='AAResNet', checkpoint=None):
        init_cfg = dict(
            type='Pretrained',
            checkpoint=str(checkpoint)) if checkpoint else None
        model = MODELS.build(
            dict(
                type=type_,
                depth=50,
                frozen_stages=1,
                norm_eval=True,
                init_cfg=init_cfg))
        model.init_weights()
        return model

    def refusal(model):
        with pytest.raises(aa_det.utils.ConfigError) as error:
            unloaded_weights.refuse_frozen_unloaded(model)
        return str(error.value)

    scratch = backbone()
    printed = [refusal(scratch)]
    scratch.train()
    torch.save(
        dict(state_dict={
            f'backbone.{k}': v
            for k, v in scratch.state_dict().items()
        }), tmp_path / 'cls.pth')
    printed.append(refusal(backbone(checkpoint=tmp_path / 'cls.pth')))
    torch.save(
        dict(state_dict=backbone('ResNet').state_dict()),
        tmp_path / 'resnet50.pth')
    backbone(checkpoint=tmp_path / 'resnet50.pth').train()
    printed += [
        line.replace(str(tmp_path / 'resnet50.pth'), 'torchvision://resnet50')
        for line in logged
    ]
    assert len(printed) == 4, printed
    spans = _doc_spans(
        'docs/detection.md',
        'aa_det: model.backbone (AAResNet): frozen_stages',
        'aa_det: model.backbone (AAResNet): init_cfg Pretrained',
        'model.backbone (AAResNet): frozen_stages',
        '... at their random initialisation: init_cfg Pretrained')
    assert len(set(spans)) == 4, spans
    for span in spans:
        assert any(
            re.fullmatch(_span_pattern(span), line)
            for line in printed), (span, printed)
    for line in printed:
        assert any(re.fullmatch(_span_pattern(span), line)
                   for span in spans), (line, spans)
