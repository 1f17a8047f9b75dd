"""The example scripts run end to end (smoke test) and write what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import camkit

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("script", "outputs"),
    [
        ("explain_one_image.py", ["cat_gradcam.png"]),
        ("batch_multi_target.py", ["top3_gradcam.png", "top3_layercam.png"]),
    ],
)
def test_example_runs(script, outputs, tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    for name in outputs:
        image = camkit.read_rgb(tmp_path / name)
        assert image.ndim == 3 and image.shape[2] == 3
        assert np.unique(image.reshape(-1, 3), axis=0).shape[0] > 100  # a real picture, not a flat fill
