"""scripts/polyglot-demo.sh end to end: Swift, Python and Node stores on one bus; a Node client dispatches, the
Python and Swift clients see the same todos."""
import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def test_polyglot_demo():
    fluxd = os.environ.get("FLUXD") or os.path.join(REPO, ".build", "debug", "fluxd")
    bin_dir = os.path.dirname(os.path.abspath(fluxd))
    missing = [p for p in ("fluxd", "todo-store", "stats-store", "todo-view") if not os.access(os.path.join(bin_dir, p), os.X_OK)]
    if missing:
        pytest.skip(f"not built in {bin_dir}: {missing}")
    result = subprocess.run([os.path.join(REPO, "scripts", "polyglot-demo.sh")], cwd=REPO, timeout=120,
                            env={**os.environ, "FLUXBUS_BIN": bin_dir}, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert 'node dispatched todo/create "ship it" seq 3 -> activity:done v4, audit:done v4, stats:done v5, todos:done v4' in out
    assert "python saw todos v4 (seq 3): buy milk, write docs, ship it" in out
    assert "todos (version 4, seq 3)" in out  # the Swift view renders the same version
    assert 'audit v4: {"byType": {"todo/create": 3}, "lastSeq": 3}' in out
