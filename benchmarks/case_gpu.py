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

* **Per-call overhead** (``case_overhead.py``'s measurement on CUDA): Grad-CAM, Grad-CAM++,
  XGrad-CAM, LayerCAM and HiResCAM at batch 1, 8 and 64 on resnet50, convnext_tiny and vit_b_16
  (224x224): the no-grad forward, the floor (forward + backward to the layer, by hand), camkit,
  torchcam (and torchcam + resize), captum (Grad-CAM) and pytorch-grad-cam, 3 repeats. Goals:
  camkit no slower than the fastest anchor; at batch 64 within 1.1x of the forward. Grad-CAM
  also with ``compile=True`` beside the no-grad forward replayed from a CUDA graph: within 1.5x
  of that at batch 1 and 8, below the eager forward at batch 64.

Default: resnet50 at 224x224, an 8 GiB cap. ``--smoke``: resnet18 at 64x64, a 1 GiB cap, Grad-CAM at batch 1 and 8.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from . import case_gradcam, case_overhead
from ._harness import (
    REPO_ROOT,
    BenchmarkError,
    Context,
    Goal,
    Ratio,
    Row,
    Timing,
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
BATCHES = (1, 8, 64)
OVERHEAD = (("resnet50", "layer4"), ("convnext_tiny", "features.7"), ("vit_b_16", "encoder.layers.encoder_layer_11.ln_1"))
GRAPHED = "no-grad forward, CUDA graph replay"
OVERHEAD_BUDGET_S = 150  # the overhead rows stop starting new configurations after this

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


def graphed_forward(model: nn.Module, x: Tensor) -> Callable[[], Tensor]:
    """The no-grad forward captured as a CUDA graph; each call copies ``x`` in and replays it (the compiled floor)."""
    static = x.clone()
    side = torch.cuda.Stream(x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static)
    torch.cuda.current_stream(x.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = model(static)

    def run() -> Tensor:
        static.copy_(x)
        graph.replay()
        return out

    return run


def overhead_rows(ctx: Context) -> list[Row | Goal]:
    """The five gradient CAMs at batch 1, 8 and 64 on three models, camkit (and Grad-CAM compiled) beside the anchors."""
    out: list[Row | Goal] = []
    configs = [("resnet18", 64, "layer4", (1, 8))] if ctx.smoke else [(name, 224, layer, BATCHES) for name, layer in OVERHEAD]
    start = time.monotonic()
    for name, size, layer, batches in configs:
        model = build_model(name, ctx.device)
        for batch in batches:
            x = random_input(batch, size, ctx.device)
            where = f"{name} {size}x{size}"
            if time.monotonic() - start > OVERHEAD_BUDGET_S:  # keeps one GPU session's call in its time
                out.append(Row(TITLE, "per-call overhead", where, batch, ctx.device.type,
                               note=f"not run: this part's budget of {OVERHEAD_BUDGET_S} s was spent"))
                continue
            for method in ["Grad-CAM"] if ctx.smoke else list(case_overhead.METHODS):
                ctx.log(f"  {TITLE}: {where}, {method}, batch {batch}")
                grad_cam = method == "Grad-CAM"
                extra = {GRAPHED: graphed_forward(model, x)} if grad_cam else {}
                rows, t = case_overhead.time_method(ctx, method, model, layer, x, where, inner=1, compiled=grad_cam,
                                                    repeats=3, extra=extra)
                out += [dataclasses.replace(row, case=TITLE) for row in rows]
                out += overhead_goals(t, method, f"{where}, batch {batch}", batch)
        del model
        torch.cuda.empty_cache()
    return out


def overhead_goals(t: dict[str, Timing], method: str, setting: str, batch: int) -> list[Goal]:
    """Not slower than the fastest anchor; at batch 64 within 1.1x a no-grad forward; Grad-CAM compiled against its floors."""
    name = functools.partial("{}: {}".format, method)
    ours, forward = t.get(name(case_overhead.CAMKIT)), t.get(name(case_overhead.FORWARD))
    anchors = [v for k, v in t.items() if k.startswith(name("")) and any(
        k.startswith(name(case_overhead.label(a))) for a in ("torchcam", "captum", "pytorch-grad-cam"))
        and not k.endswith("+ resize")]
    fastest = min(anchors, key=lambda v: v.median) if anchors else None
    goals = [goal_at_most(TITLE, f"camkit {method} no slower than the fastest anchor ({setting})",
                          paired_ratio(ours, fastest) if ours and fastest else None, 1.0,
                          reason="" if fastest else "no anchor ran")]
    if batch == BATCHES[-1] and ours and forward:
        goals.append(goal_at_most(TITLE, f"camkit {method} within 1.1x of a no-grad forward ({setting})",
                                  paired_ratio(ours, forward), 1.1))
    compiled, graphed = t.get(name(case_overhead.COMPILED)), t.get(name(GRAPHED))
    if compiled and graphed and batch < BATCHES[-1]:
        goals.append(goal_at_most(TITLE, f"camkit {method} compile=True within 1.5x of the no-grad forward replayed "
                                  f"from a CUDA graph ({setting})", paired_ratio(compiled, graphed), 1.5))
    elif compiled and forward:
        goals.append(goal_at_most(TITLE, f"camkit {method} compile=True below an eager no-grad forward ({setting})",
                                  paired_ratio(compiled, forward), 1.0))
    return goals


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
    return out + overhead_rows(ctx)
