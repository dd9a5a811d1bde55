"""The Python and Node snippets of the README's "Clients in other languages" section run as shown, installed the way
that section says (the Node package as ``npm install`` of a directory leaves it: node_modules/fluxbus -> it)."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def snippet(language):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Clients in other languages"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```" + language + r"\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"expected one {language} snippet in the README's section, found {len(blocks)}"
    return blocks[0]


def test_python_snippet_runs_as_shown(fluxd):
    env = dict(os.environ, FLUXBUS_SOCKET=fluxd.socket_path, PYTHONPATH=os.path.join(ROOT, "examples", "python"))
    result = subprocess.run([sys.executable, "-c", snippet("python")], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_snippet_runs_as_shown(fluxd):
    project = tempfile.mkdtemp(prefix="fluxbus-readme-node-")
    try:
        os.mkdir(os.path.join(project, "node_modules"))
        os.symlink(os.path.join(ROOT, "examples", "node"), os.path.join(project, "node_modules", "fluxbus"))
        with open(os.path.join(project, "main.mjs"), "w", encoding="utf-8") as f:
            f.write(snippet("js"))
        env = dict(os.environ, FLUXBUS_SOCKET=fluxd.socket_path)
        result = subprocess.run(["node", "main.mjs"], cwd=project, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "[ { store: 'counter', status: 'done', version: 2 } ]" in result.stdout
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_python_readme_first_snippet_runs_as_shown(fluxd):
    """examples/python/README.md's first snippet: a store on a background thread, then the client code under it
    (it used to call the blocking ``run()`` first, so the client code never ran)."""
    with open(os.path.join(ROOT, "examples", "python", "README.md"), encoding="utf-8") as f:
        first = re.findall(r"```python\n(.*?)```", f.read(), re.S)[0]
    env = dict(os.environ, FLUXBUS_SOCKET=fluxd.socket_path, PYTHONPATH=os.path.join(ROOT, "examples", "python"))
    result = subprocess.run([sys.executable, "-c", first], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "done 2", result.stdout
    assert lines[1] == "2 {'value': 2}", result.stdout
