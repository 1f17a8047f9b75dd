"""Case 6b (``--full`` only): ``camkit audit`` over 100,000 images on the CPU, memory flat in the count.

Each size runs in a fresh process (:mod:`benchmarks._audit_scale`): 10,000 and 100,000 generated
64x64 demo images, ``--model demo``, batch 64, 2 workers. Reported: time, images/s, peak RSS of
the audit process and of its largest worker, and the sizes of ``report.html`` and
``summary.json``. Goals: peak RSS under 1 GiB at 100,000 images; peak RSS and report size at
100,000 images at most 1.2x those at 10,000 (flat in the number of images).

``--smoke``: 100 and 200 images (keeps the case working; the goals are then not meaningful).
Without ``--full`` or ``--smoke`` the case is skipped (it takes minutes).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ._harness import REPO_ROOT, Context, Goal, Ratio, Row, Timing, goal_at_most

TITLE = "Audit at scale"
ORDER = 7
GIB = 1024.0
# Batch 64: on this model it is also the fastest on 2 cores (1508 images/s at 10,000 images against
# 1390 at batch 256, measured), and it keeps the forward's working set (about 400 MiB at batch 256)
# from hiding what this case is about: memory that grows with the number of images.
BATCH = 64


def _one(count: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="camkit-bench-scale-"))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks._audit_scale", "--images", str(count), "--root", str(root),
             "--batch-size", str(BATCH)],
            cwd=REPO_ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"the scale run of {count} images failed: {proc.stderr[-800:]}")
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(ctx: Context) -> list[Row | Goal]:
    if ctx.device.type != "cpu" or not (ctx.full or ctx.smoke):
        return []
    small, large = (100, 200) if ctx.smoke else (10_000, 100_000)
    results = {n: _one(n) for n in (small, large)}
    rows: list[Row | Goal] = []
    for n, r in results.items():
        rows.append(
            Row(
                case=TITLE, impl=f"camkit audit, {n:,} images", model="demo (ShapesCNN) 64px", batch=BATCH,
                device="cpu", time=Timing((float(r["seconds"]),)), peak_mb=float(r["peak_rss_mib"]),
                note=(
                    f"{r['images_per_second']:.0f} images/s; peak RSS {r['peak_rss_mib']:.0f} MiB (largest worker "
                    f"{r['largest_worker_rss_mib']:.0f} MiB); report.html {r['report_bytes'] / 1024:.0f} KiB, "
                    f"summary.json {r['summary_bytes'] / 1024:.0f} KiB, results.csv "
                    f"{r['results_csv_bytes'] / 1024 / 1024:.1f} MiB; {r['errors']} errors"
                ),
            )
        )  # fmt: skip
    big, little = results[large], results[small]
    rows.append(
        goal_at_most(
            TITLE, f"peak RSS under 1 GiB auditing {large:,} images", Ratio.exact(big["peak_rss_mib"] / GIB), 1.0
        )
    )
    rows.append(
        goal_at_most(
            TITLE, f"peak RSS flat: at {large:,} images at most 1.2x that at {small:,}",
            Ratio.exact(big["peak_rss_mib"] / little["peak_rss_mib"]), 1.2,
        )
    )  # fmt: skip
    rows.append(
        goal_at_most(
            TITLE, f"report.html bounded: at {large:,} images at most 1.2x its size at {small:,}",
            Ratio.exact(big["report_bytes"] / little["report_bytes"]), 1.2,
        )
    )  # fmt: skip
    return rows
