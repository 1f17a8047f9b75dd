"""Shared helpers of the audit tests: small image sets, the bad-data folder, reading results, the CLI."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import cv2
import numpy as np
import torch

import camkit

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPT_NAME = "<script>alert(1)<!--.png"  # no "/" in a file name


def make_images(root: Path, classes: tuple[str, ...] = ("cat", "dog"), per_class: int = 3, size=(40, 48)) -> Path:
    """Seeded random RGB PNGs in one sub-folder per class (or flat when ``classes`` is empty)."""
    rng = np.random.default_rng(0)
    for c in classes or ("",):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            camkit.save_png(root / c / f"img{i}.png", rng.integers(0, 256, (*size, 3), dtype=np.uint8))
    return root


def make_bad_data(root: Path) -> dict[str, str]:
    """One file of each troublesome kind; returns key -> the expected error fragment ("" = audited)."""
    rng = np.random.default_rng(1)
    root.mkdir(parents=True)
    rgb = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
    camkit.save_png(root / "ok.png", rgb)
    camkit.save_png(root / SCRIPT_NAME, rgb)
    cv2.imwrite(str(root / "gray.png"), rgb[:, :, 0])
    cv2.imwrite(str(root / "rgba.png"), np.dstack([rgb, np.full((24, 24), 128, np.uint8)]))
    cv2.imwrite(str(root / "deep16.png"), (rgb[:, :, 0].astype(np.uint16) * 257))
    cv2.imwrite(str(root / "large.png"), np.zeros((600, 800, 3), np.uint8))  # 480k px: resized, audited
    cv2.imwrite(str(root / "huge.png"), np.zeros((1000, 1001, 3), np.uint8))  # > max_pixels in the tests
    (root / "empty.png").write_bytes(b"")
    png = (root / "ok.png").read_bytes()
    (root / "trunc.png").write_bytes(png[: len(png) // 2])
    _ok, jpg = cv2.imencode(".jpg", rgb)
    (root / "trunc.jpg").write_bytes(jpg.tobytes()[: len(jpg) // 2])
    (root / "notimage.jpg").write_text("this is a text file, not an image\n")
    os.symlink(root / "gone.png", root / "dangling.png")  # unreadable: the target does not exist
    return {
        "ok.png": "", SCRIPT_NAME: "", "large.png": "",
        "gray.png": "", "rgba.png": "", "deep16.png": "",
        "huge.png": "1001x1000 = 1001000 pixels, more than max_pixels=1000000",
        "empty.png": "empty.png is empty (0 bytes)",
        "trunc.png": "trunc.png is a truncated PNG",
        "trunc.jpg": "trunc.jpg is a truncated JPEG",
        "notimage.jpg": "could not be decoded as an image",
        "dangling.png": "FileNotFoundError",
    }  # fmt: skip


BAD_NOTES = {
    "gray.png": "converted from grayscale",
    "rgba.png": "converted from RGBA (alpha composited on black)",
    "deep16.png": "converted from 16-bit grayscale",
}


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    # this checkout's camkit first (an editable install elsewhere must not answer), tests/ for tinyfactory
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env


def start_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """Start ``python -m camkit ARGS`` with tests/ on PYTHONPATH (for ``tinyfactory:tiny``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "camkit", *args], cwd=cwd, env=cli_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def run_cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    """``camkit ARGS`` in this process, from ``cwd``: ``(exit code, stdout, stderr)``.

    What :func:`start_cli`'s subprocess would give, without its seconds of imports: the command's
    own ``main`` with ``cwd`` first on ``sys.path`` (as ``python -m`` puts it) and the warnings of
    a fresh interpreter; the process-wide state it may change (working folder, ``sys.path``, torch's
    thread count, modules imported from ``cwd``) is put back.
    """
    from camkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    threads, path, modules, folder = torch.get_num_threads(), list(sys.path), set(sys.modules), os.getcwd()
    sys.path[:0] = [str(cwd), str(TESTS)]
    os.chdir(cwd)  # contextlib.chdir is Python 3.11's; camkit supports 3.10
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("default")
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os.chdir(folder)
        sys.path[:] = path
        torch.set_num_threads(threads)
        for name in set(sys.modules) - modules:
            module = sys.modules[name]
            if str(getattr(module, "__file__", "") or "").startswith(str(cwd)):
                del sys.modules[name]
    return code, out.getvalue(), err.getvalue()
