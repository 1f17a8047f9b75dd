"""The runner: discover ``case_*.py`` modules, run them, write ``RESULTS.md`` and the chart.

Usage::

    python -m benchmarks                  # default cases (the ones the goals name)
    python -m benchmarks --full           # adds the model matrix
    python -m benchmarks --smoke          # tiny models, 1 repeat: keeps the runner working in CI
    python -m benchmarks --cases gradcam  # only benchmarks/case_gradcam.py
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch

from ._harness import Context, Goal, Row, describe_exception
from ._report import describe_machine, load_average, write_chart, write_markdown

HERE = Path(__file__).resolve().parent
RESULTS = "RESULTS.md"
CHART = "results.png"


def discover(names: Sequence[str] | None = None) -> list[ModuleType]:
    """The case modules, ordered by their ``ORDER`` (then name), optionally only ``names``.

    ``names`` are the parts after ``case_`` (``"gradcam"`` for ``case_gradcam.py``).
    """
    found = sorted(info.name for info in pkgutil.iter_modules([str(HERE)]) if info.name.startswith("case_"))
    if names:
        wanted = [n.removeprefix("case_") for n in names]
        unknown = sorted(set(wanted) - {f.removeprefix("case_") for f in found})
        if unknown:
            raise SystemExit(
                f"unknown case(s) {unknown}; available: {[f.removeprefix('case_') for f in found]}"
            )
        found = [f for f in found if f.removeprefix("case_") in wanted]
    modules = [importlib.import_module(f"{__package__}.{name}") for name in found]
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny models, 1 repeat (CI); writes to a temp dir by default")
    size.add_argument("--full", action="store_true", help="add the model matrix (slow; manual runs)")
    parser.add_argument("--cases", default="", help="comma-separated case names, e.g. gradcam,scorecam")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: CPU, and CUDA too when available")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 5; 1 with --smoke)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-anchors", action="store_true", help="skip the other libraries")
    parser.add_argument("--out", type=Path, default=None, help="directory for RESULTS.md and results.png")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    return parser.parse_args(argv)


def devices(choice: str) -> list[torch.device]:
    if choice == "cpu":
        return [torch.device("cpu")]
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is available")
        return [torch.device("cuda")]
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases; return 0, or 1 when a case failed (goals not met are not failures)."""
    args = parse_args(argv)
    cases = discover([c for c in args.cases.split(",") if c.strip()])
    if args.list:
        for m in cases:
            print(f"{m.__name__.rsplit('.', 1)[-1].removeprefix('case_'):<12} {getattr(m, 'TITLE', '')}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    mode = "smoke" if args.smoke else "full" if args.full else "default"
    out = args.out or (Path(tempfile.mkdtemp(prefix="camkit-bench-smoke-")) if args.smoke else HERE)
    out.mkdir(parents=True, exist_ok=True)
    devs = devices(args.device)
    machine = describe_machine(devs)
    rows: list[Row] = []
    goals: list[Goal] = []
    failures: list[str] = []
    start = time.perf_counter()
    for device in devs:
        ctx = Context(
            mode=mode,
            device=device,
            repeats=args.repeats or (1 if args.smoke else 5),
            warmup=1 if args.warmup is None else args.warmup,
            threads=torch.get_num_threads(),
            anchors=not args.no_anchors,
        )
        for module in cases:
            title = getattr(module, "TITLE", module.__name__)
            print(f"[{device.type}] {title}", flush=True)
            t0 = time.perf_counter()
            try:
                results = module.run(ctx)
            except Exception as exc:  # one broken case must not hide the others' figures
                traceback.print_exc()
                failures.append(f"{title} ({device.type}): {describe_exception(exc)}")
                continue
            for item in results:
                (goals if isinstance(item, Goal) else rows).append(item)
            print(f"[{device.type}] {title}: {time.perf_counter() - t0:.1f} s", flush=True)
    machine.load_end = load_average()
    elapsed = time.perf_counter() - start
    chart = write_chart(out / CHART, rows)
    command = "python -m benchmarks" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    write_markdown(
        out / RESULTS, mode=mode, machine=machine, rows=rows, goals=goals, failures=failures,
        chart=chart, elapsed=elapsed, command=command,
    )
    for g in goals:
        print(f"goal [{g.status}] {g.text}: {g.measured}{' — ' + g.reason if g.reason else ''}")
    print(f"wrote {out / RESULTS}" + (f" and {chart}" if chart else "") + f" in {elapsed:.1f} s")
    return 1 if failures else 0
