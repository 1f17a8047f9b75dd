"""The audit report opened in headless Chromium: the page renders its tables and images."""

from __future__ import annotations

import shutil
import subprocess

import cv2
import numpy as np
import pytest
from audit_helpers import make_bad_data

import camkit

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if shutil.os.path.exists("/usr/bin/chromium") else None)


@pytest.mark.heavy
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (CI: apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    make_bad_data(tmp_path / "data")
    camkit.audit(tmp_path / "data", "tinyfactory:tiny", out=tmp_path / "out", layer="conv2", size=32, device="cpu",
                 workers=0, progress=False, max_pixels=1_000_000)  # fmt: skip
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
           (tmp_path / "out" / "report.html").as_uri()]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    image = cv2.imread(str(shot))
    assert image.shape == (2000, 1280, 3)
    # the tables' header cells are light grey (#f3f3f3), and the embedded overlays are coloured (jet)
    grey = np.all(image == (0xF3, 0xF3, 0xF3), axis=2)
    assert grey.sum() > 2000
    hsv = cv2.cvtColor(image, cv2.COLOR_BGR2HSV)
    assert (hsv[:, :, 1] > 120).sum() > 6 * 120 * 120 // 2  # at least ~3 gallery images worth of colour
    shutil.copy(shot, tmp_path / "out" / "screenshot.png")  # kept next to the report for a human look
