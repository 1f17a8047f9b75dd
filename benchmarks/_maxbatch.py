"""Largest batch under a memory cap, run as ``python -m benchmarks._maxbatch '<json spec>'`` in a fresh process.

The spec names a job (``"module:function"``), its keyword arguments, the device and the
cap in MiB. ``function(device, batch, **params)`` builds one call at ``batch`` and returns a
no-argument callable (the model is built once by the job's module and cached there).

On CUDA the process is capped with ``torch.cuda.set_per_process_memory_fraction`` at the
memory held once the model is loaded plus the cap (plus ``extra_mib`` from the spec: an
anchor's own copy of the model, so each implementation gets the same room for its work).
The batch is doubled from ``start`` until a call runs out of memory, then bisected down to
``resolution`` images (:func:`largest_batch`). Every try frees what it held and empties the
caching allocator before the next. On the CPU there is no per-process cap: the probe refuses.

It prints one JSON line: ``{"batch", "tries", "cap_mib", "base_mib"}``.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
from collections.abc import Callable
from typing import Any


def largest_batch(fits: Callable[[int], bool], *, start: int = 8, limit: int = 4096, resolution: int = 4) -> tuple[int, int]:
    """The largest batch ``b`` (a multiple of ``resolution``, at most ``limit``) with ``fits(b)``; 0 if none.

    Assumes ``fits`` is monotone (true up to some batch, false after). Returns ``(batch, tries)``.

    Example:
        >>> largest_batch(lambda b: b <= 100, start=8, resolution=4)
        (100, 9)
        >>> largest_batch(lambda b: False)
        (0, 2)
    """
    tries = 0

    def check(b: int) -> bool:
        nonlocal tries
        tries += 1
        return fits(b)

    good, bad = 0, None
    b = max(resolution, start)
    while b <= limit:
        if not check(b):
            bad = b
            break
        good, b = b, b * 2
    if bad is None:
        if good == 0:
            return 0, tries
        if good >= limit:
            return good, tries
        bad = limit + resolution
    if good == 0:  # even ``start`` failed: search below it
        low = resolution
        while low < bad and not check(low):
            low *= 2
            if low >= bad:
                return 0, tries
        good = low
    while bad - good > resolution:
        mid = (good + bad) // 2 // resolution * resolution
        if mid <= good:
            break
        if check(mid):
            good = mid
        else:
            bad = mid
    return good, tries


def measure(job: str, params: dict[str, Any], device_name: str, cap_mib: float, extra_mib: float,
            start: int, resolution: int, limit: int) -> dict[str, Any]:
    import torch

    device = torch.device(device_name)
    if device.type != "cuda":
        raise SystemExit("the largest-batch probe needs a CUDA device (there is no per-process memory cap on the CPU)")
    module_name, _, func_name = job.partition(":")
    build = getattr(importlib.import_module(module_name), func_name)
    build(device, batch=1, **params)()  # loads the model (cached by the job) and warms up
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    allowed = base + (cap_mib + extra_mib) * 2**20
    torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total), device)

    def fits(batch: int) -> bool:
        run = None
        try:
            run = build(device, batch=batch, **params)
            out = run()
            torch.cuda.synchronize(device)
            del out
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            del run
            gc.collect()
            torch.cuda.empty_cache()

    batch, tries = largest_batch(fits, start=start, limit=limit, resolution=resolution)
    return {"batch": batch, "tries": tries, "cap_mib": cap_mib, "base_mib": base / 2**20}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks._maxbatch '<json spec>'", file=sys.stderr)
        return 2
    spec = json.loads(args[0])
    result = measure(
        spec["job"], dict(spec.get("params", {})), spec.get("device", "cuda"), float(spec["cap_mib"]),
        float(spec.get("extra_mib", 0.0)), int(spec.get("start", 8)), int(spec.get("resolution", 4)),
        int(spec.get("limit", 4096)),
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
