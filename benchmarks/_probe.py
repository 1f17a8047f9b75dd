"""Peak-memory probe, run as ``python -m benchmarks._probe '<json spec>'`` in a fresh process.

The spec names a job (``"module:function"``), its keyword arguments, the device and the
thread count. The probe builds the job (model, input, explainer, any warm-up), then:

* CUDA: synchronises, resets the peak statistics, records ``memory_allocated()`` as the
  baseline, runs the job once, and reports ``max_memory_allocated() - baseline``.
* CPU (Linux): collects garbage and returns free heap pages to the OS (glibc
  ``malloc_trim``), resets the peak resident set size by writing ``5`` to
  ``/proc/self/clear_refs``, records ``VmRSS`` as the baseline, runs the job once, and
  reports ``VmHWM - baseline``. Where ``VmHWM`` cannot be reset (non-Linux), it falls back
  to ``ru_maxrss`` and says so (``"exact": false``): the peak since the process started.

It prints one JSON line: ``{"peak_bytes", "base_bytes", "method", "exact"}``.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import re
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(job: str, params: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Build ``job`` and measure the peak memory of one call above the built state."""
    import torch

    module_name, _, func_name = job.partition(":")
    build = getattr(importlib.import_module(module_name), func_name)
    run = build(device, **params)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = run()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del out
        return {"peak_bytes": peak, "base_bytes": base, "method": "cuda max_memory_allocated", "exact": True}
    _trim_heap()
    if _reset_hwm() and (base_kib := _status_kib("VmRSS")) is not None:
        out = run()
        hwm_kib = _status_kib("VmHWM") or 0
        del out
        return {
            "peak_bytes": max(0, hwm_kib - base_kib) * 1024,
            "base_bytes": base_kib * 1024,
            "method": "VmHWM after clear_refs reset",
            "exact": True,
        }
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    out = run()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del out
    return {
        "peak_bytes": max(0, peak_kib - base_kib) * scale,
        "base_bytes": base_kib * scale,
        "method": "ru_maxrss (not resettable; a lower bound)",
        "exact": False,
    }


def selftest_job(device: torch.device, mib: int) -> Callable[[], torch.Tensor]:
    """A job whose call allocates and fills ``mib`` MiB: checks the probe measures what it should."""
    import torch

    count = mib * 2**20 // 4
    return lambda: torch.ones(count, dtype=torch.float32, device=device)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks._probe '<json spec>'", file=sys.stderr)
        return 2
    spec = json.loads(args[0])
    module_name = str(spec["job"]).partition(":")[0]
    importlib.import_module(module_name)  # a wrong job name fails here, before torch is loaded
    import torch

    if "threads" in spec:
        torch.set_num_threads(int(spec["threads"]))
    result = measure(spec["job"], dict(spec.get("params", {})), torch.device(spec.get("device", "cpu")))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
