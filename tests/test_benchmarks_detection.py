"""The detector benchmark case (``benchmarks/case_detection.py``) end to end on tiny inputs, without anchors.

Nothing here writes into ``benchmarks/``: the report goes to pytest's ``tmp_path``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _runner  # noqa: E402


@pytest.mark.slow  # CI's `make bench-smoke` runs this case on the same tiny inputs (68 s here as a test)
def test_runner_runs_the_detection_case_on_tiny_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "yolo"))
    code = _runner.main(["--smoke", "--no-anchors", "--cases", "detection", "--device", "cpu", "--out", str(tmp_path)])
    assert code == 0
    text = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert "Grad-CAM on detectors" in text and "fasterrcnn_mobilenet_v3_large_320_fpn 64x96" in text
    runs = 2 if "yolov8n 64x64" in text else 1
    assert text.count("within 1.3x of a no-grad forward") == runs
    assert text.count("within 1.1x of the floor") == runs and text.count("floor: the backward the score needs") == runs
