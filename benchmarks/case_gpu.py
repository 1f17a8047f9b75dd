"""Case 8: GPU-sized Grad-CAM: batch 64, and the largest batch that fits under a memory cap.

CUDA only; on the CPU the case reports one "skipped" row (a batch of 64 resnet50 images and
a per-process memory cap are GPU questions).

* **Batch 64**: case 1's measurement (``benchmarks.case_gradcam``) at batch 64: a no-grad
  forward, camkit's ``GradCAM`` and the anchors, interleaved, each anchor on its own copy of
  the model, maps compared. Goal: camkit's time no more than the fastest anchor's.
* **Largest batch under a cap**: for the no-grad forward, camkit and each anchor, a fresh
  process (``python -m benchmarks._maxbatch``) caps itself with
  ``torch.cuda.set_per_process_memory_fraction`` at the loaded model plus ``CAP_GIB`` (plus
  one model's size for an anchor, which explains its own copy), doubles the batch until a
  call runs out of memory and bisects to 4 images. Goal: camkit's largest batch at least the
  best anchor's.

Default: resnet50 at 224x224, an 8 GiB cap. ``--smoke``: resnet18 at 64x64, a 1 GiB cap.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import case_gradcam
from ._harness import (
    REPO_ROOT,
    BenchmarkError,
    Context,
    Goal,
    Ratio,
    Row,
    build_model,
    goal_at_least,
    goal_at_most,
    paired_ratio,
    random_input,
)

TITLE = "GPU-sized Grad-CAM"
ORDER = 8
CAP_GIB = 8.0
BATCH = 64

_NETS: dict[tuple[str, str], nn.Module] = {}


def _config(ctx: Context) -> tuple[str, int, float]:
    return ("resnet18", 64, 1.0) if ctx.smoke else ("resnet50", 224, CAP_GIB)


def maxbatch_job(device: torch.device, batch: int, impl: str, model: str, size: int) -> Callable[[], Any]:
    """One call of ``impl`` at ``batch`` (the model is built once per process); classes are fixed, not a forward."""
    key = (model, str(device))
    if key not in _NETS:
        _NETS[key] = build_model(model, device)
    net = _NETS[key]
    x = random_input(batch, size, device)
    classes = torch.arange(batch, device=device) % 10
    prepared = case_gradcam.prepare(impl, net, case_gradcam.LAYERS[model], x, classes)

    def run() -> None:
        try:
            prepared.run()
        finally:
            prepared.close()

    return run


def largest_batch(ctx: Context, impl: str, model: str, size: int, cap_gib: float) -> dict[str, Any]:
    """Run the capped bisection for ``impl`` in a fresh process; its JSON result."""
    extra = 0.0
    if impl not in (case_gradcam.FORWARD, case_gradcam.CAMKIT):
        net = build_model(model, "meta")
        extra = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()]) / 2**20
    spec = {
        "job": f"{__name__}:maxbatch_job", "params": {"impl": impl, "model": model, "size": size},
        "device": str(ctx.device), "cap_mib": cap_gib * 1024, "extra_mib": extra,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._maxbatch", json.dumps(spec)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=ctx.probe_timeout, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise BenchmarkError(f"largest-batch probe for {impl} failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    ctx.log(f"    {impl}: largest batch {result['batch']} under {cap_gib:g} GiB ({result['tries']} tries)")
    return result


def run(ctx: Context) -> list[Row | Goal]:
    if ctx.device.type != "cuda":
        note = "skipped: CUDA only (batch 64 and a per-process memory cap); run python -m benchmarks --device cuda"
        return [Row(TITLE, "skipped", device=ctx.device.type, note=note)]
    model, size, cap = _config(ctx)
    out: list[Row | Goal] = []
    ctx.log(f"  {TITLE}: {model} {size}x{size}, time at batch {BATCH}")
    rows, timings = case_gradcam._time_config(ctx, case_gradcam.Config(model, size, BATCH, None))
    out += [dataclasses.replace(row, case=TITLE) for row in rows]
    ours = timings.get(case_gradcam.label(case_gradcam.CAMKIT))
    anchors = [timings[case_gradcam.label(a)] for a in case_gradcam.ANCHOR_MODULES if case_gradcam.label(a) in timings]
    fastest = min(anchors, key=lambda t: t.median) if anchors else None
    out.append(goal_at_most(
        TITLE, f"camkit GradCAM no slower than the fastest anchor ({model}, {size}x{size}, batch {BATCH})",
        paired_ratio(ours, fastest) if ours and fastest else None, 1.0,
        reason="" if fastest else "no anchor ran (pip install -e '.[bench]')",
    ))

    ctx.log(f"  {TITLE}: {model}, largest batch under a {cap:g} GiB cap")
    found: dict[str, int] = {}
    for impl in case_gradcam._usable(ctx):
        name = case_gradcam.label(impl)
        try:
            result = largest_batch(ctx, impl, model, size, cap)
        except (BenchmarkError, subprocess.TimeoutExpired) as exc:
            out.append(Row(TITLE, name, model, None, ctx.device.type, note=str(exc).splitlines()[0]))
            continue
        found[impl] = int(result["batch"])
        out.append(Row(TITLE, f"{name}, largest batch under {cap:g} GiB", model, found[impl], ctx.device.type,
                       note=f"{result['tries']} tries, loaded model {result['base_mib']:.0f} MiB"))
    best = max((found[a] for a in case_gradcam.ANCHOR_MODULES if a in found), default=None)
    ratio = Ratio.exact(found[case_gradcam.CAMKIT] / best) if best and case_gradcam.CAMKIT in found else None
    out.append(goal_at_least(
        TITLE, f"camkit GradCAM's largest batch under {cap:g} GiB at least the best anchor's ({model}, {size}x{size})",
        ratio, 1.0, reason="" if best else "no anchor ran",
    ))
    return out
