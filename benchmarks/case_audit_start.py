"""Case 6c: an audit's fixed cost: ``camkit audit`` of 64 JPEGs against a bare script, whole processes.

Each repeat starts two fresh processes, one after the other (their order alternating between
repeats), on the same seeded folder of 64 JPEGs (320x240):

* the **bare script** (``benchmarks/_audit_bare.py``, run by path: it imports torch and
  torchvision only) decodes the images, resizes and normalises them, builds the same
  torchvision model with random weights, and per batch of 16 runs the forward (autograd on, as
  a plain script does), the gradient of the top-1 scores at the CAM layer and the Grad-CAM map,
  brought back to the host: a Grad-CAM pass over the folder with nothing else, writing nothing;
* ``python -m camkit audit DATA --model torchvision:NAME --size 224`` with its defaults (batch
  16, DataLoader workers, strategies, overlays, ``results.csv``, ``summary.json``,
  ``report.html``), into a fresh output folder.

Both are timed from the parent: wall-clock time from start to exit, and CPU time (user and
system, of the process and the children it waited for, such as DataLoader workers). The goal is
on the wall-clock difference, paired repeat by repeat: at most 3 s above the bare script. The
audit's own ``summary.json`` gives the seconds of its loop (decode to last batch written), which
the notes carry. Configurations: resnet18 on the CPU; resnet50 on CUDA (when the device is a
GPU). ``--smoke``: resnet18 at 64x64 on 8 images.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._harness import MET, NOT_MEASURED, NOT_MET, REPO_ROOT, WITHIN_SPREAD, Context, Goal, Row, Timing

TITLE = "Audit start (whole process)"
ORDER = 6

GOAL_S = 3.0
BARE = "bare script (torch, torchvision)"
AUDIT = "camkit audit"


def _folder(root: Path, count: int) -> None:
    """``count`` seeded 320x240 JPEGs, smooth enough to look like photographs."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for i in range(count):
        image = cv2.GaussianBlur(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8), (0, 0), 2)
        cv2.imwrite(str(root / f"img{i:04d}.jpg"), image)


def _timed(argv: list[str]) -> tuple[float, float]:
    """Run ``argv`` from the repository root; (wall seconds, CPU seconds of it and its waited-for children)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed (exit {proc.returncode}): {proc.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _spread_goal(text: str, diffs: list[float]) -> Goal:
    if not diffs:
        return Goal(TITLE, text, "-", NOT_MEASURED, "no repeat ran")
    status = MET if max(diffs) <= GOAL_S else NOT_MET if min(diffs) > GOAL_S else WITHIN_SPREAD
    measured = f"{statistics.median(diffs):+.2f} s ({min(diffs):+.2f} to {max(diffs):+.2f})"
    reason = {MET: "", WITHIN_SPREAD: f"the spread straddles {GOAL_S} s"}.get(status, f"every repeat above {GOAL_S} s")
    return Goal(TITLE, text, measured, status, reason)


def _compare(ctx: Context, model: str, size: int, count: int, repeats: int) -> list[Row | Goal]:
    device = ctx.device.type
    root = Path(tempfile.mkdtemp(prefix="camkit-bench-start-"))
    try:
        data = root / "data"
        _folder(data, count)
        bare = [sys.executable, str(REPO_ROOT / "benchmarks" / "_audit_bare.py"), str(data), "--model", model,
                "--size", str(size), "--device", device]  # fmt: skip
        walls: dict[str, list[float]] = {BARE: [], AUDIT: []}
        cpus: dict[str, list[float]] = {BARE: [], AUDIT: []}
        loops: list[float] = []
        for r in range(repeats):
            for name in (BARE, AUDIT) if r % 2 == 0 else (AUDIT, BARE):
                out = root / f"out{r}"
                audit = [sys.executable, "-m", "camkit", "audit", str(data), "--model", f"torchvision:{model}",
                         "--size", str(size), "--device", device, "--out", str(out), "--no-progress"]  # fmt: skip
                wall, cpu = _timed(bare if name == BARE else audit)
                walls[name].append(wall)
                cpus[name].append(cpu)
                if name == AUDIT:
                    loops.append(float(json.loads((out / "summary.json").read_text()).get("seconds", float("nan"))))
                    shutil.rmtree(out, ignore_errors=True)
            ctx.log(f"    repeat {r + 1}: bare {walls[BARE][-1]:.2f} s, camkit audit {walls[AUDIT][-1]:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    config = f"{model} {size}px, {count} JPEGs"
    rows: list[Row | Goal] = []
    for name in (BARE, AUDIT):
        note = f"CPU time {statistics.median(cpus[name]):.2f} s (min {min(cpus[name]):.2f}, max {max(cpus[name]):.2f})"
        if name == AUDIT:
            note += f"; the audit loop (summary.json) {statistics.median(loops):.2f} s"
        rows.append(Row(TITLE, name, config, 16, device, time=Timing(tuple(walls[name])), note=note))
    diffs = [a - b for a, b in zip(walls[AUDIT], walls[BARE])]
    cpu_diffs = [a - b for a, b in zip(cpus[AUDIT], cpus[BARE])]
    rows.append(Row(TITLE, "difference (camkit audit - bare)", config, 16, device, time=Timing(tuple(diffs)),
                    note=f"CPU time difference {statistics.median(cpu_diffs):+.2f} s"))  # fmt: skip
    rows.append(_spread_goal(f"camkit audit's whole process at most {GOAL_S:g} s above the bare script ({config}, "
                             f"{device})", diffs))  # fmt: skip
    return rows


def run(ctx: Context) -> list[Row | Goal]:
    repeats = 1 if ctx.smoke else ctx.repeats
    if ctx.smoke:
        return _compare(ctx, "resnet18", 64, 8, repeats)
    if ctx.device.type == "cuda":
        return _compare(ctx, "resnet50", 224, 64, repeats)
    return _compare(ctx, "resnet18", 224, 64, repeats)
