"""Write ``RESULTS.md`` and the time-per-method chart from one run's rows and goals."""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from ._harness import Goal, Row, package_version

DISTS = ("torch", "torchvision", "camkit", "numpy", "grad-cam", "captum", "torchcam")


@dataclass
class Machine:
    """What the figures were measured on."""

    cpu: str
    cores: int
    threads: int
    devices: list[str]
    python: str
    versions: dict[str, str]
    date: str
    load_start: tuple[float, float, float] | None = None
    load_end: tuple[float, float, float] | None = None
    extra: list[str] = field(default_factory=list)
    allocator: str = "unknown"
    blas_threads: str = "unknown"


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or "unknown")


def allocator() -> str:
    """How CPU memory is allocated in this process: a preloaded allocator, or malloc and its settings.

    On Linux, glibc returns large freed blocks to the kernel under its default settings, so
    methods that keep many activation-sized buffers page-fault them in again on every call;
    the setting changes the CPU timings of those methods (see docs/guide/performance.md).
    """
    preload = [Path(p).name for p in os.environ.get("LD_PRELOAD", "").split() if p]
    tuned = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "THP_MEM_ALLOC_ENABLE")
    tunables = os.environ.get("GLIBC_TUNABLES")
    if tunables:
        tuned.append(f"GLIBC_TUNABLES={tunables}")
    parts = [f"preloaded {', '.join(preload)}"] if preload else []
    parts.append("malloc settings " + " ".join(tuned) if tuned else "the C library's malloc with its default settings")
    return "; ".join(parts)


def blas_threads() -> str:
    """numpy's BLAS thread setting (``OPENBLAS_NUM_THREADS``): an anchor's scikit-learn calls run on it."""
    value = os.environ.get("OPENBLAS_NUM_THREADS")
    return f"OPENBLAS_NUM_THREADS={value}" if value else "OpenBLAS's default (one thread per core)"


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except (OSError, AttributeError):
        return None


def describe_machine(devices: Sequence[torch.device]) -> Machine:
    names = []
    for d in devices:
        names.append(torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu")
    versions = {d: v for d in DISTS if (v := package_version(d)) is not None}
    versions["torch"] = torch.__version__  # with its build tag (+cpu, +cu130)
    return Machine(
        cpu=cpu_model(),
        cores=os.cpu_count() or 1,
        threads=torch.get_num_threads(),
        devices=names,
        python=sys.version.split()[0],
        versions=versions,
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        load_start=load_average(),
        allocator=allocator(),
        blas_threads=blas_threads(),
    )


BUSY_LOAD = 0.5


def busy(machine: Machine) -> bool:
    """Whether the machine had other work on it (1-min load above ``BUSY_LOAD`` per core) at the start or end.

    The load at the end includes the run's own work (up to ``threads`` busy threads), so
    that much is taken off it before the comparison.
    """
    limit = BUSY_LOAD * machine.cores
    start = machine.load_start[0] if machine.load_start is not None else 0.0
    end = machine.load_end[0] - machine.threads if machine.load_end is not None else 0.0
    return start > limit or end > limit


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _cell(text: object) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def _ratio_cell(row: Row) -> str:
    return f"{row.ratio} vs {row.ratio_to}" if row.ratio is not None else ""


def _time_table(rows: Sequence[Row]) -> list[str]:
    out = [
        "| Implementation | Model | Batch | Device | Median (ms) | Min-max (ms) | Ratio to baseline | camkit ÷ this "
        "| Max abs diff vs camkit | Note |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.time is None:
            continue
        diff = f"{r.max_diff:.2e}" if r.max_diff is not None else ""
        out.append(
            f"| {_cell(r.impl)} | {r.model} | {r.batch or ''} | {r.device} | {_ms(r.time.median)} | "
            f"{_ms(r.time.min)}-{_ms(r.time.max)} | {_ratio_cell(r)} | {r.camkit_ratio or ''} | {diff} | {_cell(r.note)} |"
        )
    return out


def _memory_table(rows: Sequence[Row]) -> list[str]:
    out = [
        "| Implementation | Model | Batch | Device | Peak above loaded model (MiB) | Ratio to baseline | camkit ÷ this | Note |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| {_cell(r.impl)} | {r.model} | {r.batch or ''} | {r.device} | {r.peak_mb:.1f} | {_ratio_cell(r)} | "
            f"{r.camkit_ratio or ''} | {_cell(r.note)} |"
        )
    return out


METHOD_TEXT = """\
- **Time**: after warm-up, the implementations being compared run interleaved (each repeat
  calls every one once, in an order rotated by one per repeat); the median of the repeats is
  given with their min-max. CUDA timings are synchronised. Ratios are taken repeat by repeat
  (the paired runs) and given as median (min-max).
- **Peak memory**: one call in a fresh process per implementation, above the memory held once
  the model, input and explainer are loaded (CUDA: `max_memory_allocated`; CPU: peak resident
  set size `VmHWM`, reset through `/proc/self/clear_refs` after a warm-up at batch 1).
- **Agreement**: max absolute difference between camkit's maps and each anchor's, after the
  anchor's maps get camkit's output contract (bilinear upsampling, then per-map min-max).
- **Goals**: *met* when the whole spread of the ratio meets the goal, *not met* when the whole
  spread misses it, *within spread* when the spread straddles it."""


def write_markdown(
    path: Path,
    *,
    mode: str,
    machine: Machine,
    rows: Sequence[Row],
    goals: Sequence[Goal],
    failures: Sequence[str],
    chart: Path | None,
    elapsed: float,
    command: str,
) -> None:
    """Regenerate ``RESULTS.md`` at ``path``."""
    v = machine.versions
    lines = [
        "# camkit benchmark results",
        "",
        f"Generated by `{command}` (mode: **{mode}**) on {machine.date}, in {elapsed / 60:.1f} min. "
        "Every figure below comes from that one run; do not edit by hand, rerun `make bench` "
        "(`python -m benchmarks --full` adds the model matrix).",
        "",
        "## Machine",
        "",
        f"- CPU: {machine.cpu}, {machine.cores} logical cores, torch threads: {machine.threads}",
        f"- Devices: {', '.join(machine.devices)}",
        f"- CPU memory allocator: {machine.allocator}",
        f"- numpy's BLAS threads (scikit-learn inside an anchor): {machine.blas_threads}",
        f"- Python {machine.python}; " + ", ".join(f"{k} {val}" for k, val in v.items()),
    ]
    if machine.load_start is not None:
        end = f"; at the end: {machine.load_end[0]:.2f}" if machine.load_end else ""
        lines.append(f"- Load average (1 min) at the start: {machine.load_start[0]:.2f}{end}")
    lines += [f"- {e}" for e in machine.extra]
    if busy(machine):
        lines += [
            "",
            f"> **Preliminary**: other work was running (load average above {BUSY_LOAD} per core), so the "
            "times are noisy. Rerun on a quiet machine before quoting them.",
        ]
    lines += ["", "## How the figures are measured", "", METHOD_TEXT, "", "## Goals", ""]
    if goals:
        lines += ["| Case | Goal | Measured | Status | Reason |", "|---|---|---|---|---|"]
        lines += [f"| {g.case} | {_cell(g.text)} | {g.measured} | **{g.status}** | {_cell(g.reason)} |" for g in goals]
    else:
        lines.append("No goals were evaluated in this run.")
    lines += ["", "## Results", ""]
    if chart is not None:
        lines += [f"![Time per method]({chart.name})", ""]
    for case in dict.fromkeys(r.case for r in rows):
        case_rows = [r for r in rows if r.case == case]
        lines += [f"### {case}", ""]
        timed = [r for r in case_rows if r.time is not None]
        memory = [r for r in case_rows if r.peak_mb is not None]
        other = [r for r in case_rows if r.time is None and r.peak_mb is None]
        if timed:
            lines += ["Time:", "", *_time_table(timed), ""]
        if memory:
            lines += ["Peak memory:", "", *_memory_table(memory), ""]
        for r in other:
            lines.append(f"- {r.impl} ({r.model}, batch {r.batch}, {r.device}): {_cell(r.note)}")
        if other:
            lines.append("")
    if failures:
        lines += ["## Failures", ""] + [f"- {_cell(f)}" for f in failures] + [""]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


def _groups(rows: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r.time is not None:
            groups.setdefault(f"{r.case}: {r.model}, batch {r.batch}, {r.device}", []).append(r)
    return list(groups.items())


def write_chart(path: Path, rows: Sequence[Row]) -> Path | None:
    """Horizontal bars of the median time per implementation (min-max as error bars).

    Uses matplotlib when it is installed (it comes with the ``bench`` extra), else draws
    with OpenCV. Returns ``None`` when there is nothing to draw.
    """
    groups = _groups(rows)
    if not groups:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _chart_cv2(path, groups)
        return path
    height = sum(0.35 * len(g) + 0.8 for _, g in groups)
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, max(2.5, height)), squeeze=False)
    for ax, (title, group) in zip(axes[:, 0], groups):
        medians = np.array([r.time.median * 1e3 for r in group if r.time])
        lo = medians - np.array([r.time.min * 1e3 for r in group if r.time])
        hi = np.array([r.time.max * 1e3 for r in group if r.time]) - medians
        colors = ["tab:orange" if r.impl.startswith("camkit") else "tab:blue" for r in group]
        ax.barh(range(len(group)), medians, xerr=[lo, hi], color=colors, capsize=3)
        ax.set_yticks(range(len(group)), [r.impl for r in group])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("median time per call (ms), bars: min-max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _chart_cv2(path: Path, groups: list[tuple[str, list[Row]]]) -> None:
    import cv2

    bar_h, left, width = 22, 260, 900
    height = sum(40 + bar_h * len(g) for _, g in groups) + 20
    img = np.full((height, width, 3), 255, np.uint8)
    y = 10
    for title, group in groups:
        cv2.putText(img, title, (10, y + 18), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
        y += 30
        top = max(r.time.max for r in group if r.time) or 1.0
        for r in group:
            if r.time is None:
                continue
            scale = (width - left - 90) / top
            color = (0, 128, 255) if r.impl.startswith("camkit") else (200, 120, 30)  # BGR
            cv2.putText(img, r.impl[:32], (10, y + 15), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
            cv2.rectangle(img, (left, y + 3), (left + int(r.time.median * scale), y + bar_h - 3), color, -1)
            cv2.line(img, (left + int(r.time.min * scale), y + bar_h // 2), (left + int(r.time.max * scale), y + bar_h // 2),
                     (0, 0, 0), 1)
            cv2.putText(img, f"{r.time.median * 1e3:.1f} ms", (left + int(top * scale) + 5, y + 15),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
            y += bar_h
        y += 10
    cv2.imwrite(str(path), img)
