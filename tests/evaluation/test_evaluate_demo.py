"""The guide's demo figures (docs/img/evaluate_demo.json) are what a fresh run of docs/evaluate_demo.py gives."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("evaluate_demo", ROOT / "docs" / "evaluate_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def close(a, b, path=""):
    """Equal JSON trees, floats within 1e-6 (another machine's last bits)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-6), path
    else:
        assert a == b, path


@pytest.mark.slow
def test_the_committed_demo_figures_match_a_fresh_run(tmp_path):
    script = load_script()
    fresh = json.loads(json.dumps(script.figures(script.run(tmp_path, progress=False))))
    committed = json.loads((ROOT / "docs" / "img" / "evaluate_demo.json").read_text())
    close(committed, fresh)
