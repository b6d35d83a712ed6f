"""``tests/tool_process.run_python``, which the tool tests run our tools with, gives what a fresh
``python SCRIPT ARGS`` gives: the same stdout, stderr and exit status, argv, ``sys.path[0]``,
environment and working folder (a script that imports nothing heavy, so both runs take well under a
second)."""
import os
import subprocess
import sys

import pytest

from tool_process import run_python

SCRIPT = """import os, sys
print(sys.argv[1:], sys.path[0] == os.path.dirname(os.path.abspath(__file__)), os.getcwd(), os.environ.get('PROBE'))
print('to stderr', file=sys.stderr)
kind = sys.argv[1]
if kind == 'code':
    sys.exit(3)
if kind == 'message':
    sys.exit('stopped: a message')
if kind == 'raise':
    raise ValueError('boom')
"""


@pytest.mark.parametrize('kind', ['ok', 'code', 'message', 'raise'])
def test_run_python_is_a_fresh_interpreters_run(kind, tmp_path):
    script = tmp_path / 'script.py'
    script.write_text(SCRIPT)
    env = dict(os.environ, PROBE='probe value')
    forked = run_python([script, kind, 'two words'], env=env, cwd=tmp_path)
    fresh = subprocess.run([sys.executable, str(script), kind, 'two words'], capture_output=True, text=True,
                           env=env, cwd=tmp_path)
    assert forked.returncode == fresh.returncode == {'ok': 0, 'code': 3, 'message': 1, 'raise': 1}[kind]
    assert forked.stdout == fresh.stdout == f"['{kind}', 'two words'] True {tmp_path} probe value\n"
    if kind == 'raise':  # the same traceback from the script's frame on; the forked run has runpy's frames above it
        def from_script(err):
            return err[err.index(f'  File "{script}"'):]
        assert forked.stderr.startswith('to stderr\nTraceback') and fresh.stderr.startswith('to stderr\nTraceback')
        assert from_script(forked.stderr) == from_script(fresh.stderr)
        assert fresh.stderr.endswith('ValueError: boom\n')
    else:
        assert forked.stderr == fresh.stderr
