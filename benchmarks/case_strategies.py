"""Case: what the strategies cost an audit, and concept relevance against Grad-CAM.

* **On the demo**: the audit's explain work on the demo's 200 images (the bundled ShapesCNN,
  Grad-CAM at ``last_conv`` recording each channel's relevance, batches of 50: what the audit's
  explain stage runs) against :func:`camkit.audit.strategies.find_strategies` on their
  downsampled maps and concept vectors (4 classes, both kinds). Goal: at most 10% of it.
  Interleaved with them, ``find_strategies`` on 400 demo images (4 classes of 100) splits its
  time into a fixed cost per class (both kinds) and a cost per image, round by round
  (``2 T(200) - T(400)`` and ``(T(400) - T(200)) / 200``), and gives the class size from which
  the strategies stay within 10% of the explain time.
* **At 100,000 images**: ``find_strategies`` on synthetic downsampled maps (16 x 16) and concept
  vectors (64 channels, the demo layer's) of 10 classes of 10,000, each class a mix of three
  planted groups, timed once; against the demo's explain time per image times 100,000
  (extrapolated, not run). Goal: at most 10%.
* **An audit's share** (resnet18 112x112, 384 images, batch 16 on the CPU; resnet50, 8,192
  images, batch 64 on CUDA; random weights, seeded random inputs made batch by batch on the
  device): the audit's explain pass without strategies (Grad-CAM at ``layer4`` with the
  predicted class, maps to the host) and with them (each channel's relevance recorded in the same
  pass, maps downsampled and vectors to the host, as :class:`camkit.audit.stages.ExplainStage`
  does), interleaved, and :func:`~camkit.audit.strategies.find_strategies` on those features
  (classes: the predictions) on the device. The strategies' share is, round by round, (the
  features' extra time + ``find_strategies``) / the pass without them. Goal: at most 10%. On
  CUDA a row also times ``find_strategies`` on the CPU, to show where the clustering is faster.
* **Concept relevance on resnet50** (random weights, batch 8, 224x224, ``layer4``):
  ``ConceptRelevance.relevance`` (each channel's relevance, [B, 2048]) against ``GradCAM``, side
  by side; also Grad-CAM recording the relevance in its own pass (what the audit does) and one
  conditional map per image (a backward down to the input). Goal: relevance at most 1.3x Grad-CAM.

Smoke mode: 40 demo images (80 for the split), 2,000 synthetic images, resnet18 at 64x64, batch 2;
the audit's share on 32 images of 64x64.
"""

from __future__ import annotations

import time

import numpy as np
import torch

import camkit

from ._harness import (
    BenchmarkError,
    Context,
    Goal,
    Ratio,
    Row,
    Timing,
    build_model,
    goal_at_most,
    paired_ratio,
    random_input,
    rows_for_timings,
)

TITLE = "Strategies and concept relevance"
ORDER = 31
GOAL_SHARE = 0.10
GOAL_CONCEPTS = 1.3


def _demo_inputs(n: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    from camkit.bundled.model import load_shapes_cnn
    from camkit.bundled.shapes import make_split, to_batch

    x, y = to_batch(make_split("marked", n, seed=2))
    return load_shapes_cnn().eval(), x, y


def _synthetic(n: int, classes: int = 10, channels: int = 64, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Downsampled maps [n, 16, 16] and vectors [n, channels], each class three planted groups."""
    rng = np.random.default_rng(seed)
    labels = [f"c{i % classes}" for i in range(n)]
    group = rng.integers(0, 3, n)
    maps = rng.uniform(0, 0.3, (n, 16, 16)).astype(np.float32)
    rows, cols = 2 + 5 * group, 2 + 4 * group
    for g in range(3):
        pick = group == g
        maps[pick, rows[pick][0] : rows[pick][0] + 3, cols[pick][0] : cols[pick][0] + 3] += 1.0
    centres = rng.normal(0, 1, (3, channels)).astype(np.float32)
    vectors = centres[group] + 0.3 * rng.normal(0, 1, (n, channels)).astype(np.float32)
    return labels, maps.astype(np.float16), vectors.astype(np.float16)


def _share_config(ctx: Context) -> tuple[str, int, int, int]:
    """(model, size, images, batch) of the audit's-share block."""
    if ctx.smoke:
        return "resnet18", 64, 32, 16
    return ("resnet50", 224, 8192, 64) if ctx.device.type == "cuda" else ("resnet18", 112, 384, 16)


def _audit_share(ctx: Context) -> list[Row | Goal]:
    """The strategies' share of an audit's explain time (see the module docstring)."""
    from camkit.audit.strategies import find_strategies
    from camkit.audit.strategies.store import downsample_maps
    from camkit.runs.explaining import explain_batch
    from camkit.runs.targeting import chooser, parse_target

    name, size, count, batch = _share_config(ctx)
    net = build_model(name, ctx.device).eval()
    plain, recording = camkit.GradCAM(net, "layer4"), camkit.GradCAM(net, "layer4")
    recording.record_relevance = True
    choose = chooser(parse_target("pred"))
    kept: dict[str, np.ndarray] = {}

    def explain_pass(features: bool) -> None:
        gen = torch.Generator(ctx.device).manual_seed(0)
        maps, vectors, classes = [], [], []
        for start in range(0, count, batch):
            x = torch.randn(min(batch, count - start), 3, size, size, generator=gen, device=ctx.device)
            out = explain_batch(recording if features else plain, x, choose)
            if not features:
                out.maps.float().cpu()
                continue
            out.maps.float().cpu()  # the overlays' maps, as without strategies
            maps.append(downsample_maps(torch.nan_to_num(out.maps.detach().float(), nan=0.0)).cpu().numpy())
            if out.relevance is None:
                raise BenchmarkError("Grad-CAM recorded no channel relevance")
            vectors.append(torch.nan_to_num(out.relevance.detach().float()).half().cpu().numpy())
            classes.append(out.classes.cpu().numpy())
        if features:
            kept.update(maps=np.concatenate(maps), vectors=np.concatenate(vectors), classes=np.concatenate(classes))

    def strategies(device: torch.device) -> None:
        if "maps" not in kept:
            raise BenchmarkError("find_strategies timed before an explain pass gave it features")
        find_strategies([str(int(c)) for c in kept["classes"]], kept["maps"].astype(np.float32),
                        kept["vectors"].astype(np.float32), device=device)  # fmt: skip

    warm = torch.randn(2, 3, size, size, device=ctx.device)
    explain_batch(plain, warm, choose), explain_batch(recording, warm, choose)
    ctx.log(f"  {TITLE}: audit's share, {name} {size}x{size}, {count} images, batch {batch}")
    names = {"plain": f"explain {count} images (no strategies)", "features": f"explain {count} images + features",
             "strategies": f"find_strategies on {count} images ({ctx.device.type})"}  # fmt: skip
    fns = {names["plain"]: lambda: explain_pass(False), names["features"]: lambda: explain_pass(True),
           names["strategies"]: lambda: strategies(ctx.device)}  # fmt: skip
    if ctx.device.type != "cpu":
        names["host"] = f"find_strategies on {count} images (cpu)"
        fns[names["host"]] = lambda: strategies(torch.device("cpu"))
    timings = ctx.time(fns, repeats=1 if ctx.smoke else min(ctx.repeats, 3), warmup=0)
    plain_t, feat_t, strat_t = (timings[names[k]].samples for k in ("plain", "features", "strategies"))
    shares = [(f - p + s) / p for p, f, s in zip(plain_t, feat_t, strat_t)]
    share = Ratio(float(np.median(shares)), min(shares), max(shares))
    sizes = np.bincount(np.unique(kept["classes"], return_inverse=True)[1])
    note = f"{len(sizes)} predicted classes, the largest {int(sizes.max())} images"
    rows: list[Row | Goal] = list(rows_for_timings(TITLE, timings, reference=names["plain"], model=f"{name} {size}px",
                                                   batch=batch, device=ctx.device, camkit=names["strategies"]))  # fmt: skip
    rows.append(Row(TITLE, "strategies' share (features' extra time + find_strategies)", f"{name} {size}px", batch,
                    ctx.device.type, ratio=share, ratio_to=names["plain"], note=note))  # fmt: skip
    rows.append(goal_at_most(TITLE, f"strategies at most 10% of the audit's explain time ({name} {size}px, {count} "
                             f"images, {ctx.device.type})", share, GOAL_SHARE))  # fmt: skip
    return rows


def _demo_features(explainer: camkit.GradCAM, x: torch.Tensor) -> dict[str, np.ndarray]:
    """The audit's explain pass on ``x`` in batches of 50: downsampled maps and concept vectors (float16)."""
    from camkit.audit.strategies.store import downsample_maps
    from camkit.runs.explaining import explain_batch
    from camkit.runs.targeting import chooser, parse_target

    choose = chooser(parse_target("pred"))
    maps: list[np.ndarray] = []
    vectors: list[np.ndarray] = []
    for i in range(0, len(x), 50):
        out = explain_batch(explainer, x[i : i + 50], choose)
        if out.relevance is None:
            raise BenchmarkError("Grad-CAM recorded no channel relevance")
        maps.append(downsample_maps(out.maps).cpu().numpy())
        vectors.append(out.relevance.half().cpu().numpy())
    return {"maps": np.concatenate(maps), "vectors": np.concatenate(vectors)}


def _demo(ctx: Context, demo_n: int) -> tuple[list[Row | Goal], float]:
    """The demo's rows (the share, and its split into fixed and per-image costs); the explain time per image."""
    from camkit.audit.strategies import find_strategies
    from camkit.bundled.model import CAM_LAYER

    model, x, y = _demo_inputs(demo_n)
    _, x2, y2 = _demo_inputs(2 * demo_n)
    explainer = camkit.GradCAM(model, CAM_LAYER)
    explainer.record_relevance = True
    sets = {demo_n: (_demo_features(explainer, x), [str(int(c)) for c in y]),
            2 * demo_n: (_demo_features(explainer, x2), [str(int(c)) for c in y2])}  # fmt: skip

    def strategies(n: int) -> None:
        features, names = sets[n]
        find_strategies(names, features["maps"].astype(np.float32), features["vectors"].astype(np.float32),
                        device=ctx.device)  # fmt: skip

    ctx.log(f"  {TITLE}: demo, {demo_n} images (and {2 * demo_n} for the split)")
    explain_name, strat_name = f"explain {demo_n} demo images (audit's pass)", f"strategies of {demo_n} images"
    double_name = f"strategies of {2 * demo_n} images"
    timings = ctx.time({explain_name: lambda: _demo_features(explainer, x), strat_name: lambda: strategies(demo_n),
                        double_name: lambda: strategies(2 * demo_n)})  # fmt: skip
    rows: list[Row | Goal] = list(rows_for_timings(TITLE, timings, reference=explain_name, model="ShapesCNN (demo)",
                                                   batch=50, device=ctx.device, camkit=strat_name))  # fmt: skip
    rows.append(goal_at_most(TITLE, f"strategies at most 10% of the audit's explain time (demo, {demo_n} images)",
                             paired_ratio(timings[strat_name], timings[explain_name]), GOAL_SHARE))  # fmt: skip
    rows += _split_rows(ctx, timings[explain_name], timings[strat_name], timings[double_name], demo_n, len(set(y.tolist())))
    return rows, timings[explain_name].median / demo_n


def _split_rows(ctx: Context, explain: Timing, single: Timing, double: Timing, n: int, classes: int) -> list[Row | Goal]:
    """The strategies' time split, round by round, into a fixed cost per class and a cost per image."""
    per_image = [(d - s) / n for s, d in zip(single.samples, double.samples)]
    fixed = [(2 * s - d) / classes for s, d in zip(single.samples, double.samples)]
    explain_image = [e / n for e in explain.samples]
    ratio = [p / e for p, e in zip(per_image, explain_image)]
    # a class of m images: (fixed + m * per_image) / (m * explain_image) <= 10% from m = fixed / (0.1 explain - per_image)
    margin = GOAL_SHARE * float(np.median(explain_image)) - float(np.median(per_image))
    needed = f"{float(np.median(fixed)) / margin:.0f}" if margin > 0 else "never (the cost per image alone is above 10%)"
    note = (f"explain {float(np.median(explain_image)) * 1e3:.2f} ms per image; strategies within 10% of it from "
            f"classes of about {needed} images (linear model from classes of {n // classes} and {2 * n // classes})")  # fmt: skip
    return [
        Row(TITLE, "strategies' fixed cost per class (maps + concepts)", "ShapesCNN (demo)", None, ctx.device.type,
            time=Timing(tuple(fixed)), note=note),
        Row(TITLE, "strategies' cost per image", "ShapesCNN (demo)", None, ctx.device.type, time=Timing(tuple(per_image)),
            ratio=Ratio(float(np.median(ratio)), min(ratio), max(ratio)), ratio_to="explain time per image"),
    ]  # fmt: skip


def _at_scale(ctx: Context, scale_n: int, per_image: float) -> list[Row | Goal]:
    """``find_strategies`` on ``scale_n`` synthetic images against the demo's explain time, extrapolated."""
    from camkit.audit.strategies import find_strategies

    labels, maps, vectors = _synthetic(scale_n)
    ctx.log(f"  {TITLE}: {scale_n} synthetic images, 10 classes")
    start = time.perf_counter()
    found = find_strategies(labels, maps.astype(np.float32), vectors.astype(np.float32), device=ctx.device)
    took = time.perf_counter() - start
    share = took / (per_image * scale_n)
    counts = sorted({len(g.strategies) for g in found.maps.values()})
    note = (f"one run; explain time extrapolated: {per_image * 1e3:.2f} ms per image x {scale_n}; "
            f"{counts} map strategies per class (3 planted); features {maps.nbytes + vectors.nbytes >> 20} MiB")  # fmt: skip
    return [
        Row(TITLE, f"strategies of {scale_n} synthetic images", model="synthetic", batch=None, device="cpu",
            time=Timing((took,)), ratio=Ratio.exact(share), ratio_to=f"explain {scale_n} demo images (extrapolated)",
            note=note),
        goal_at_most(TITLE, f"strategies at most 10% of the audit's explain time ({scale_n} images)",
                     Ratio.exact(share), GOAL_SHARE, reason=note),
    ]  # fmt: skip


def _concepts(ctx: Context) -> list[Row | Goal]:
    """Concept relevance against Grad-CAM on resnet50 (resnet18 in smoke mode)."""
    name, size, batch = ("resnet18", 64, 2) if ctx.smoke else ("resnet50", 224, 8)
    net = build_model(name, ctx.device).eval()
    xr = random_input(batch, size, ctx.device)
    gradcam = camkit.GradCAM(net, "layer4")
    recording = camkit.GradCAM(net, "layer4")
    recording.record_relevance = True
    concepts = camkit.ConceptRelevance(net, "layer4")
    ctx.log(f"  {TITLE}: {name} {size}x{size}, batch {batch}")
    fns = {
        "GradCAM": lambda: gradcam(xr),
        "GradCAM + channel relevance (audit)": lambda: recording.explain(xr),
        "ConceptRelevance.relevance": lambda: concepts.relevance(xr),
        "ConceptRelevance, 1 conditional map": lambda: concepts.explain(xr, channels=1),
    }
    t = ctx.time(fns)
    rows: list[Row | Goal] = list(rows_for_timings(TITLE, t, reference="GradCAM", model=name, batch=batch,
                                                   device=ctx.device, camkit="ConceptRelevance.relevance"))  # fmt: skip
    rows.append(goal_at_most(TITLE, f"concept relevance at most {GOAL_CONCEPTS}x Grad-CAM ({name}, batch {batch})",
                             paired_ratio(t["ConceptRelevance.relevance"], t["GradCAM"]), GOAL_CONCEPTS))  # fmt: skip
    return rows


def run(ctx: Context) -> list[Row | Goal]:
    demo_n, scale_n = (40, 2_000) if ctx.smoke else (200, 100_000)
    rows, per_image = _demo(ctx, demo_n)
    return rows + _at_scale(ctx, scale_n, per_image) + _concepts(ctx) + _audit_share(ctx)
