"""One audit at dataset scale in a fresh process: ``python -m benchmarks._audit_scale --images N --root DIR``.

Generates ``N`` images of the demo's shapes (64x64 PNGs in one folder per class; 1000 distinct
images, written again under new names past that), audits them with ``--model demo`` on the
CPU, and prints one JSON line: seconds, images per second, peak resident set size of this
process (``VmHWM``) and of the largest DataLoader worker (``ru_maxrss`` of the children), and
the sizes of ``report.html``, ``summary.json`` and ``results.csv``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generate(data: Path, count: int) -> None:
    """``count`` demo images in class folders (the model knows its classes: no mapping option needed)."""
    import cv2

    from camkit.bundled.shapes import CLASSES, make_split

    samples = make_split("marked", min(count, 1000), seed=11)
    encoded = [(CLASSES[s.label], cv2.imencode(".png", s.image[:, :, ::-1])[1].tobytes()) for s in samples]
    for name in CLASSES:
        (data / name).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        label, blob = encoded[i % len(encoded)]
        (data / label / f"{i:06d}.png").write_bytes(blob)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    import torch

    import camkit

    torch.set_num_threads(max(1, torch.get_num_threads()))
    data = args.root / "data"
    t0 = time.perf_counter()
    generate(data, args.images)
    generated = time.perf_counter() - t0
    before = _peak_mib()
    start = time.perf_counter()
    summary = camkit.audit(
        data, "demo", out=args.root / "out", device="cpu", batch_size=args.batch_size, workers=args.workers,
        progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    out = args.root / "out"
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "images": summary["images"], "errors": summary["errors"], "seconds": round(seconds, 2),
                "generate_seconds": round(generated, 2), "images_per_second": round(summary["images"] / seconds, 1),
                "peak_rss_mib": round(_peak_mib(), 1), "rss_before_audit_mib": round(before, 1),
                "largest_worker_rss_mib": round(children, 1), "accuracy": summary["accuracy"],
                "report_bytes": (out / "report.html").stat().st_size,
                "summary_bytes": (out / "summary.json").stat().st_size,
                "results_csv_bytes": (out / "results.csv").stat().st_size,
            }
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
