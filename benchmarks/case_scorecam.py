"""Case 2: Score-CAM time and memory against the bare masked forwards and the anchors.

Times, side by side (interleaved, median of 3): the bare cost of the masked forward passes
(one ``torch.no_grad()`` forward of a ready masked batch per chunk, as many chunks as
camkit runs), ``camkit.ScoreCAM``, torchcam's ``ScoreCAM`` and pytorch-grad-cam's
``ScoreCAM``, all with the same chunk size, the same explicit class and each on its own
deep copy of the model; also ``camkit.ScoreCAM(top_k=64)`` with its rank correlation
(Spearman, over pixels) with the full map.

Map agreement: camkit follows the issue's reading of the paper (weight = softmax
probability of the target for the masked input, no baseline); torchcam and
pytorch-grad-cam pass the scores through a softmax over the channels, so their maps are
expected to differ. Their maps are given camkit's output contract (bilinear upsample,
then per-map min-max) and compared by max |difference| and the pixel rank correlation.

Peak memory of one call above the loaded model, each in a fresh process: camkit at
``batch_size`` 16 and 64 at ``layer4`` (512 channels), camkit at ``layer3`` (256 channels)
with ``batch_size`` 16 (memory should follow the batch size, not the channel count), the
bare masked forwards at chunk 16, and the anchors at chunk 16.

Default: resnet18 (``weights=None``: the weights are random, so few channels are dead and
the top-k figures are not those of a trained model), one 224x224 image, chunks of 32 for
time. ``--smoke``: resnet18 at 64x64, chunks of 64, no anchors, two memory probes.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import camkit

from ._harness import (
    Context,
    Goal,
    Ratio,
    Row,
    build_model,
    describe_exception,
    finish_maps_like_camkit,
    goal_at_most,
    max_abs_diff,
    memory_rows,
    package_version,
    paired_ratio,
    random_input,
    rows_for_timings,
)

TITLE = "Score-CAM"
ORDER = 2

MODEL = "resnet18"
BARE = "bare masked forwards"
CAMKIT = "camkit"
TOPK = "camkit top_k=64"
ANCHORS = {"torchcam": ("torchcam", "torchcam"), "pytorch-grad-cam": ("pytorch_grad_cam", "grad-cam")}
CHANNELS = {"layer3": 256, "layer4": 512}
TIME_MARGIN = 1.05
MEMORY_SHARE = 0.5


def label(impl: str) -> str:
    if impl in ANCHORS:
        version = package_version(ANCHORS[impl][1])
        return f"{impl} {version}" if version else impl
    return impl


def rank_correlation(a: Tensor, b: Tensor) -> float:
    """Spearman correlation of two maps over their pixels (ties broken by position), on the CPU (any devices in)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    ra = a.flatten().double().argsort().argsort().double()
    rb = b.flatten().double().argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def prepare(impl: str, model: nn.Module, layer: str, x: Tensor, cls: int, chunk: int) -> tuple[Callable[[], Any], Callable[[], None]]:
    """``(run, close)`` for one implementation; ``run()`` returns maps [1, H, W] (or None for the bare run)."""
    size = (x.shape[-2], x.shape[-1])
    if impl == BARE:
        channels = CHANNELS[layer]
        masks = torch.rand(min(chunk, channels), 1, *size, generator=torch.Generator().manual_seed(0)).to(x)
        masked = x * masks

        def bare() -> None:
            with torch.no_grad():
                for start in range(0, channels, chunk):
                    model(masked[: min(chunk, channels - start)])

        return bare, lambda: None
    if impl in (CAMKIT, TOPK):
        explainer = camkit.ScoreCAM(model, layer, batch_size=chunk, top_k=64 if impl == TOPK else None)
        return (lambda: explainer(x, target=cls)), lambda: None
    own = copy.deepcopy(model)
    if impl == "torchcam":
        from torchcam.methods import ScoreCAM as TCScoreCAM

        extractor = TCScoreCAM(own, layer, batch_size=chunk, input_shape=tuple(x.shape[1:]))

        def torchcam_run() -> Tensor:
            scores = own(x)
            return finish_maps_like_camkit(extractor(class_idx=cls, scores=scores)[0], size)

        return torchcam_run, extractor.remove_hooks
    if impl == "pytorch-grad-cam":
        from pytorch_grad_cam import ScoreCAM as PGCScoreCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        cam = PGCScoreCAM(model=own, target_layers=[own.get_submodule(layer)])
        cam.batch_size = chunk
        targets = [ClassifierOutputTarget(cls)]

        def pgc_run() -> Tensor:
            with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar cannot be turned off
                maps = cam(input_tensor=x, targets=targets)
            return finish_maps_like_camkit(torch.from_numpy(maps), size)

        return pgc_run, cam.activations_and_grads.release
    raise ValueError(f"unknown implementation {impl!r}")


def memory_job(device: torch.device, impl: str, layer: str, chunk: int, size: int) -> Callable[[], Any]:
    """Probe job: one Score-CAM call (or the bare masked forwards) on one image."""
    net = build_model(MODEL, device)
    small = random_input(1, 64, device, seed=1)  # 64: layer4 keeps 2x2 positions (1x1 maps are refused)
    warm, close = prepare(CAMKIT if impl == BARE else impl, net, layer, small, 0, chunk)
    warm()
    close()
    x = random_input(1, size, device)
    run, _ = prepare(impl, net, layer, x, 0, chunk)
    return run


def run(ctx: Context) -> list[Row | Goal]:
    size, chunk = (64, 64) if ctx.smoke else (224, 32)
    layer = "layer4"
    net = build_model(MODEL, ctx.device)
    x = random_input(1, size, ctx.device)
    with torch.no_grad():
        cls = int(net(x).argmax(dim=1))
    # Smoke runs skip the anchors: each one is another 512 forward passes.
    impls = [BARE, CAMKIT, TOPK] + [a for a in ANCHORS if ctx.available(ANCHORS[a][0]) and not ctx.smoke]
    ctx.log(f"  {TITLE}: {MODEL} {size}x{size}, {layer}, chunks of {chunk}")
    prepared: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {}
    outputs: dict[str, Any] = {}
    rows: list[Row] = []
    for impl in impls:
        try:
            prepared[impl] = prepare(impl, net, layer, x, cls, chunk)
            outputs[impl] = prepared[impl][0]()  # also the warm-up call
        except Exception as exc:
            rows.append(Row(TITLE, label(impl), MODEL, 1, ctx.device.type, note=describe_exception(exc)))
            prepared.pop(impl, None)
    explanation = camkit.ScoreCAM(net, layer, batch_size=chunk).explain(x, target=cls)
    ours = outputs[CAMKIT]
    diffs, notes = {}, {CAMKIT: f"{explanation.extras['scored']} masks scored of 512 channels"
                                   + (" (repeated masks skipped)" if ctx.device.type == "cpu" else "")}
    for impl, maps in outputs.items():
        if impl in (BARE, CAMKIT) or maps is None:
            continue
        diffs[label(impl)] = max_abs_diff(ours, maps)
        notes[label(impl)] = f"pixel rank correlation with camkit {rank_correlation(ours, maps):.3f}"
        if impl in ANCHORS:
            notes[label(impl)] += " (softmax over channels: a different reading of the paper)"
    topk_corr = rank_correlation(ours, outputs[TOPK]) if TOPK in outputs else None
    outputs.clear()
    try:
        timings = ctx.time({label(i): p[0] for i, p in prepared.items()}, repeats=ctx.repeats if ctx.smoke else 3, warmup=0)
    finally:
        for _, close in prepared.values():
            close()
    rows = rows_for_timings(TITLE, timings, reference=BARE, model=MODEL, batch=1, device=ctx.device,
                            diffs=diffs, notes=notes) + rows
    if topk_corr is not None and TOPK in timings:
        speedup = paired_ratio(timings[CAMKIT], timings[TOPK])
        ctx.log(f"    top_k=64: speed-up {speedup}, rank correlation with the full map {topk_corr:.3f}")

    jobs = [(BARE, layer, 16), (CAMKIT, layer, 16)]
    if not ctx.smoke:
        jobs += [(CAMKIT, layer, 64), (CAMKIT, "layer3", 16)] + [(a, layer, 16) for a in ANCHORS if ctx.available(ANCHORS[a][0])]
    peaks, mem_notes = ctx.peaks(f"{__name__}:memory_job", {
        f"{label(impl)} {where} batch_size {bs}": {"impl": impl, "layer": where, "chunk": bs, "size": size}
        for impl, where, bs in jobs
    })  # fmt: skip
    ref, ours16 = f"{BARE} {layer} batch_size 16", f"{CAMKIT} {layer} batch_size 16"
    rows += memory_rows(TITLE, peaks, reference=ref, model=MODEL, batch=1, device=ctx.device, camkit=ours16)
    rows += [Row(TITLE, n, MODEL, 1, ctx.device.type, note=t) for n, t in mem_notes.items()]

    where = f"{MODEL}, {size}x{size}, {layer}, one image, chunks of {chunk}"
    anchor_times = [timings[label(a)] for a in ANCHORS if label(a) in timings]
    fastest = min(anchor_times, key=lambda t: t.median) if anchor_times else None
    pgc16 = peaks.get(f"{label('pytorch-grad-cam')} {layer} batch_size 16")
    goals = [
        goal_at_most(TITLE, f"camkit ScoreCAM no slower than the fastest anchor, 5% noise margin ({where})",
                     paired_ratio(timings[CAMKIT], fastest) if fastest and CAMKIT in timings else None, TIME_MARGIN,
                     reason="" if fastest else "no anchor installed (pip install -e '.[bench]')"),
        goal_at_most(TITLE, f"camkit peak memory at batch_size 16 at most {MEMORY_SHARE}x pytorch-grad-cam's ({MODEL}, {layer})",
                     Ratio.exact(peaks[ours16] / pgc16) if pgc16 and ours16 in peaks else None, MEMORY_SHARE),
    ]
    if topk_corr is not None and TOPK in timings:
        rows.append(Row(TITLE, f"{TOPK} vs full", MODEL, 1, ctx.device.type,
                        ratio=paired_ratio(timings[CAMKIT], timings[TOPK]), ratio_to="full / top-k time",
                        note=f"rank correlation with the full map {topk_corr:.3f} (random weights, not a trained model)"))
    return [*rows, *goals]
