"""The shared benchmark harness: timing, peak memory, map agreement, goals.

Every case module (``benchmarks/case_*.py``) uses these pieces so that all figures in
``RESULTS.md`` are measured the same way:

* :meth:`Context.time` runs the callables being compared *interleaved*: after
  ``warmup`` rounds, each repeat calls every callable once, in an order rotated by one
  each repeat, so a slow spell of the machine hits all of them alike. On CUDA each call
  is bracketed by ``torch.cuda.synchronize()``.
* :func:`paired_ratio` divides the times of two callables repeat by repeat (they ran
  side by side) and reports the median and the min-max of those ratios.
* :meth:`Context.peak_memory` runs a memory job in a fresh Python process
  (``python -m benchmarks._probe``) and returns its peak memory above what was
  allocated once the job was built (model, input and explainer loaded): on CUDA
  ``max_memory_allocated`` after ``reset_peak_memory_stats``; on CPU the process's peak
  resident set size, read as ``VmHWM`` from ``/proc/self/status`` after resetting it by
  writing ``5`` to ``/proc/self/clear_refs`` (free heap memory is returned to the OS
  with ``malloc_trim`` first, so the baseline holds only live objects).
* :func:`goal_at_most` / :func:`goal_at_least` mark a goal met only when the whole
  spread of the paired ratios satisfies it, not met when the whole spread misses it,
  and "within spread" otherwise.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "MET",
    "NOT_MEASURED",
    "NOT_MET",
    "WITHIN_SPREAD",
    "BenchmarkError",
    "Context",
    "Goal",
    "Ratio",
    "Row",
    "Timing",
    "build_model",
    "describe_exception",
    "finish_maps_like_camkit",
    "goal_at_least",
    "goal_at_most",
    "max_abs_diff",
    "memory_rows",
    "package_version",
    "paired_ratio",
    "random_input",
    "rows_for_timings",
    "time_interleaved",
]

MET = "met"
NOT_MET = "not met"
WITHIN_SPREAD = "within spread"
NOT_MEASURED = "not measured"

REPO_ROOT = Path(__file__).resolve().parent.parent


class BenchmarkError(RuntimeError):
    """A benchmark could not be measured (e.g. its memory probe process failed)."""


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of one callable, in seconds, one sample per repeat."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def iqr(self) -> tuple[float, float]:
        """First and third quartiles (inclusive method; equal to min/max for one sample)."""
        if len(self.samples) == 1:
            return self.samples[0], self.samples[0]
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3


@dataclass(frozen=True)
class Ratio:
    """A ratio with its spread: ``median`` of the per-repeat ratios and their min-max."""

    median: float
    lo: float
    hi: float

    @classmethod
    def exact(cls, value: float) -> Ratio:
        """A single measurement (no spread), e.g. a peak-memory ratio."""
        return cls(value, value, value)

    def __str__(self) -> str:
        if self.lo == self.hi:
            return f"{self.median:.2f}x"
        return f"{self.median:.2f}x ({self.lo:.2f}-{self.hi:.2f})"


def paired_ratio(numerator: Timing, denominator: Timing) -> Ratio:
    """Ratio of two interleaved timings, repeat by repeat.

    Example:
        >>> str(paired_ratio(Timing((2.0, 3.0, 4.0)), Timing((1.0, 2.0, 2.0))))
        '2.00x (1.50-2.00)'
    """
    if len(numerator.samples) != len(denominator.samples):
        raise ValueError(
            f"paired_ratio needs timings from the same interleaved run; got {len(numerator.samples)} and "
            f"{len(denominator.samples)} samples"
        )
    ratios = [a / b for a, b in zip(numerator.samples, denominator.samples)]
    return Ratio(statistics.median(ratios), min(ratios), max(ratios))


@dataclass(frozen=True)
class Row:
    """One line of the results table: a time or a peak memory of one implementation.

    Attributes:
        case: the case title, e.g. ``"Grad-CAM"``; rows of one case are grouped.
        impl: what was measured, e.g. ``"camkit"``, ``"pytorch-grad-cam 1.5.7"``.
        model, batch, device: the configuration.
        time: wall-clock timing (``None`` for memory rows).
        peak_mb: peak memory above the loaded model, MiB (``None`` for time rows).
        ratio, ratio_to: this row's figure divided by the row whose ``impl`` is ``ratio_to``
            (the case's baseline, e.g. the no-grad forward).
        camkit_ratio: camkit's figure divided by this row's (below 1: camkit is faster/smaller).
        max_diff: max absolute difference between camkit's maps and this row's maps.
        note: free text (errors, conventions).
    """

    case: str
    impl: str
    model: str = ""
    batch: int | None = None
    device: str = "cpu"
    time: Timing | None = None
    peak_mb: float | None = None
    ratio: Ratio | None = None
    ratio_to: str = ""
    camkit_ratio: Ratio | None = None
    max_diff: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Goal:
    """A goal stated by an issue, with its status: met, not met, within spread, not measured."""

    case: str
    text: str
    measured: str
    status: str
    reason: str = ""


def _status(ok_lo: bool, ok_hi: bool) -> str:
    if ok_lo and ok_hi:
        return MET
    if not ok_lo and not ok_hi:
        return NOT_MET
    return WITHIN_SPREAD


def goal_at_most(case: str, text: str, ratio: Ratio | None, limit: float, reason: str = "") -> Goal:
    """A goal ``ratio <= limit`` (e.g. "within 1.15x of a no-grad forward").

    Met only if the whole spread is at most ``limit``; not met if the whole spread is above.

    Example:
        >>> goal_at_most("c", "t", Ratio(1.1, 1.0, 1.2), 1.15).status
        'within spread'
    """
    if ratio is None:
        return Goal(case, text, "-", NOT_MEASURED, reason)
    status = _status(ratio.lo <= limit, ratio.hi <= limit)
    if status == WITHIN_SPREAD and not reason:
        reason = f"the spread {ratio.lo:.2f}-{ratio.hi:.2f}x straddles {limit}x"
    return Goal(case, text, str(ratio), status, reason if status != MET else "")


def goal_at_least(case: str, text: str, ratio: Ratio | None, limit: float, reason: str = "") -> Goal:
    """A goal ``ratio >= limit`` (e.g. "at least 2.5x faster"); the spread rule as in :func:`goal_at_most`."""
    if ratio is None:
        return Goal(case, text, "-", NOT_MEASURED, reason)
    status = _status(ratio.lo >= limit, ratio.hi >= limit)
    if status == WITHIN_SPREAD and not reason:
        reason = f"the spread {ratio.lo:.2f}-{ratio.hi:.2f}x straddles {limit}x"
    return Goal(case, text, str(ratio), status, reason if status != MET else "")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int,
    device: torch.device | str = "cpu",
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Time callables side by side: warm-up rounds, then ``repeats`` interleaved rounds.

    Repeat ``r`` calls the callables in their given order rotated by ``r``, so none is
    always first or last. Each call is timed alone (synchronised on CUDA); its result is
    dropped before the next call starts.

    Example:
        >>> calls = []
        >>> t = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        ...                      repeats=2, warmup=1)
        >>> calls, len(t["a"].samples)
        (['a', 'b', 'a', 'b', 'b', 'a'], 2)
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = torch.device(device)
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    _sync(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            _sync(device)
            start = clock()
            result = fns[name]()
            _sync(device)
            samples[name].append(clock() - start)
            del result
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def finish_maps_like_camkit(raw: Tensor, size: tuple[int, int]) -> Tensor:
    """camkit's output contract applied to another library's maps, for comparison.

    ``raw`` is [B, h, w] or [B, 1, h, w]; the result is float32 [B, H, W]: bilinear
    upsampling (``align_corners=False``), then per-map min-max (constant maps become 0).
    For maps that were already min-max normalised at layer resolution this is the same
    as normalising after upsampling, because bilinear upsampling is affine-equivariant.

    Example:
        >>> finish_maps_like_camkit(torch.tensor([[[0.0, 2.0]]]), (1, 4))
        tensor([[[0.0000, 0.2500, 0.7500, 1.0000]]])
    """
    raw = torch.as_tensor(raw).detach().float()
    if raw.dim() == 4:
        raw = raw[:, 0]
    up = F.interpolate(raw[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]
    flat = up.flatten(1)
    lo = flat.amin(dim=1)[:, None, None]
    span = (flat.amax(dim=1) - flat.amin(dim=1))[:, None, None]
    return torch.where(span > 0, (up - lo) / span.clamp_min(torch.finfo(up.dtype).tiny), torch.zeros_like(up))


def max_abs_diff(a: Tensor | Any, b: Tensor | Any) -> float:
    """Largest absolute difference between two maps of the same shape (tensors or arrays).

    Example:
        >>> max_abs_diff(torch.tensor([0.0, 1.0]), torch.tensor([0.25, 1.0]))
        0.25
    """
    ta = torch.as_tensor(a).detach().cpu().double()
    tb = torch.as_tensor(b).detach().cpu().double()
    if ta.shape != tb.shape:
        raise ValueError(f"maps to compare must have the same shape, got {list(ta.shape)} and {list(tb.shape)}")
    return float((ta - tb).abs().max())


def build_model(name: str, device: torch.device | str = "cpu") -> nn.Module:
    """A torchvision model by name, randomly initialised (``weights=None``), seeded, in eval mode."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None)
    return model.eval().to(device)


def random_input(batch: int, size: int, device: torch.device | str = "cpu", seed: int = 0) -> Tensor:
    """A seeded input batch [batch, 3, size, size] roughly like normalised images."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g).to(device)


def package_version(dist: str) -> str | None:
    """Installed version of a distribution, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class Context:
    """What a case gets: the configuration and the measuring tools.

    Attributes:
        mode: ``"smoke"`` (tiny models, 1 repeat, CI), ``"default"`` or ``"full"`` (adds the
            model matrix).
        device: where to run.
        repeats, warmup: defaults for :meth:`time`.
        threads: ``torch.get_num_threads()`` used here and in memory probes.
        anchors: whether anchor libraries may be used (``--no-anchors`` turns them off).
    """

    mode: str = "default"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    repeats: int = 5
    warmup: int = 1
    threads: int = field(default_factory=torch.get_num_threads)
    anchors: bool = True
    probe_timeout: float = 600.0
    log: Callable[[str], None] = field(default=lambda msg: print(msg, flush=True))

    @property
    def smoke(self) -> bool:
        return self.mode == "smoke"

    @property
    def full(self) -> bool:
        return self.mode == "full"

    def available(self, module: str) -> bool:
        """Whether an anchor (an importable module, e.g. ``"captum"``) may be used."""
        return self.anchors and importlib.util.find_spec(module) is not None

    def time(
        self, fns: Mapping[str, Callable[[], object]], *, repeats: int | None = None, warmup: int | None = None
    ) -> dict[str, Timing]:
        """:func:`time_interleaved` with this context's device, repeats and warm-up."""
        timings = time_interleaved(
            fns,
            repeats=self.repeats if repeats is None else repeats,
            warmup=self.warmup if warmup is None else warmup,
            device=self.device,
        )
        for name, t in timings.items():
            self.log(f"    {name:<28} median {t.median * 1e3:9.1f} ms  (min-max {t.min * 1e3:.1f}-{t.max * 1e3:.1f})")
        return timings

    def peak_memory(
        self, job: str, *, probe_env: Mapping[str, str] | None = None, probe_threads: int | None = None, **params: Any
    ) -> float:
        """Peak memory (MiB) of one call of ``job`` above its loaded state, in a fresh process.

        ``probe_env``: environment variables for the probe process only (for instance glibc's
        ``MALLOC_MMAP_THRESHOLD_``, to measure without the allocator keeping freed memory);
        ``probe_threads``: its torch threads (default: :attr:`threads`).

        Args:
            job: ``"module:function"``; ``function(device: torch.device, **params)`` builds
                the model, input and explainer (running any warm-up it needs at a small batch)
                and returns a no-argument callable that does the measured work once.
            params: JSON-serialisable keyword arguments for the job.

        Raises:
            BenchmarkError: the probe process failed; the message holds its stderr tail.
        """
        threads = self.threads if probe_threads is None else probe_threads
        spec = {"job": job, "params": params, "device": str(self.device), "threads": threads}
        env = {**os.environ, **(probe_env or {})}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks._probe", json.dumps(spec)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=self.probe_timeout,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
            raise BenchmarkError(f"memory probe for {job} {params} failed (exit {proc.returncode}):\n{tail}")
        result = json.loads(lines[-1])
        peak = float(result["peak_bytes"]) / 2**20
        self.log(f"    {job.split(':')[-1]} {params}: peak {peak:.1f} MiB above {result['base_bytes'] / 2**20:.0f} MiB loaded")
        return peak

    def peaks(
        self, job: str, runs: Mapping[str, Mapping[str, Any]], *, probe_env: Mapping[str, str] | None = None
    ) -> tuple[dict[str, float], dict[str, str]]:
        """:meth:`peak_memory` of each named parameter set: ``({name: MiB}, {name: why its probe failed})``.

        Smoke runs start two probe processes at a time, each with half the threads: each measures
        its own process, and the wait (mostly each process importing torch) halves. Measuring runs
        start one at a time, with every thread, so that no probe shares the CPU with another.
        """
        side_by_side = 2 if self.smoke and self.threads >= 2 else 1
        threads = self.threads // side_by_side

        def probe(name: str) -> tuple[str, float | None, str | None]:
            try:
                return name, self.peak_memory(job, probe_env=probe_env, probe_threads=threads, **runs[name]), None
            except BenchmarkError as exc:
                return name, None, describe_exception(exc)

        with ThreadPoolExecutor(max_workers=side_by_side) as pool:
            done = list(pool.map(probe, runs))
        peaks = {name: peak for name, peak, _ in done if peak is not None}
        notes = {name: why for name, _, why in done if why is not None}
        for name, why in notes.items():
            self.log(f"    memory {name}: failed ({why})")
        return peaks, notes


def rows_for_timings(
    case: str,
    timings: Mapping[str, Timing],
    *,
    reference: str,
    model: str,
    batch: int,
    device: torch.device,
    camkit: str = "camkit",
    diffs: Mapping[str, float] | None = None,
    notes: Mapping[str, str] | None = None,
) -> list[Row]:
    """Time rows for one interleaved run, with paired ratios to ``reference`` and from ``camkit``."""
    ref = timings[reference]
    ours = timings.get(camkit)
    return [
        Row(
            case=case,
            impl=name,
            model=model,
            batch=batch,
            device=device.type,
            time=t,
            ratio=None if name == reference else paired_ratio(t, ref),
            ratio_to="" if name == reference else reference,
            camkit_ratio=None if ours is None or name in (camkit, reference) else paired_ratio(ours, t),
            max_diff=(diffs or {}).get(name),
            note=(notes or {}).get(name, ""),
        )
        for name, t in timings.items()
    ]


def memory_rows(
    case: str,
    peaks: Mapping[str, float],
    *,
    reference: str,
    model: str,
    batch: int,
    device: torch.device,
    camkit: str = "camkit",
    notes: Mapping[str, str] | None = None,
) -> list[Row]:
    """Peak-memory rows, with ratios to ``reference``'s peak and from ``camkit``'s."""
    ref = peaks.get(reference)
    ours = peaks.get(camkit)
    return [
        Row(
            case=case,
            impl=name,
            model=model,
            batch=batch,
            device=device.type,
            peak_mb=mb,
            ratio=None if name == reference or not ref else Ratio.exact(mb / ref),
            ratio_to="" if name == reference or not ref else reference,
            camkit_ratio=None if ours is None or not mb or name in (camkit, reference) else Ratio.exact(ours / mb),
            note=(notes or {}).get(name, ""),
        )
        for name, mb in peaks.items()
    ]


def describe_exception(exc: BaseException, limit: int = 160) -> str:
    """A one-line description of an exception for a table note."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"
