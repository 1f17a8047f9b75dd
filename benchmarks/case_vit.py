"""Attention rollout, Chefer's rollout and LeGrad on ViTs, against a no-grad forward and torchcam's LeGrad.

Times, side by side (interleaved) on one model and batch: a ``torch.no_grad()`` forward,
``camkit.AttentionRollout``, ``camkit.CheferRollout`` and ``camkit.LeGrad`` as a user gets them
(``path="auto"``: the whole graph where its estimated memory fits the budget, which on CUDA is 80%
of the free device memory, else block by block; on the CPU block by block: segments of blocks
called again and differentiated for Chefer, one forward per half of the batch for LeGrad with the
classes given), LeGrad with ``target=None`` (the same classes, each image's prediction: a forward
without graph names them first), each of the two with the other path forced (``path="whole"`` on
the CPU, ``path="blockwise"`` on CUDA), and, on torchvision's ViT (the only family it takes),
torchcam 0.5's ``LeGrad`` over every encoder block, on its own deep copy of the model. Every
implementation explains the same classes: each image's top-1. The path the default took is in
its row's note. Peak memory of one call is measured above the loaded model: on the CPU each
implementation in a fresh process (``ctx.peak_memory``), as in the other cases; on CUDA in this
process, by CUDA's own counter (``torch.cuda.max_memory_allocated`` after a reset), which is exact
and spares a process start per row.

Agreement: torchcam's LeGrad map (``normalized=False``, at the patch grid) is passed through
camkit's output contract (bilinear upsampling with ``align_corners=False``, then per-map
min-max) and compared with camkit's LeGrad ``maps``.

Models, randomly initialised (torchvision's classification head, which starts at zero, is drawn
from N(0, 0.02^2) so that gradients are not all zero), at 224 x 224. CPU: timm's
``vit_small_patch16_224`` and torchvision's ``vit_b_16`` at batch 8, timed and measured;
torchvision's ``vit_l_16`` at batch 8 for peak memory only (no timing, no torchcam: its
whole-graph backward would hold tens of GiB). CUDA: ``vit_b_16`` and ``vit_l_16`` at batch 8 and
32, each timed and measured. ``--smoke``: the same families at 32 x 32 with 2 blocks of width 32,
batch 2.

Peak memory is measured twice on the CPU: under glibc's default allocator settings (what a user
gets: freed blocks of up to 32 MiB can stay in the process, so the resident peak counts memory
that is free again) and with ``MALLOC_MMAP_THRESHOLD_=65536`` (:data:`LIVE_ENV`: every tensor of
64 KiB or more is its own mapping, returned when freed, so the resident peak is the peak of the
live memory, what CUDA's ``max_memory_allocated`` measures on a GPU).

Goals: rollout at most 1.3x a no-grad forward; CheferRollout and LeGrad (both ways) at most 4x a
no-grad forward on the CPU; on CUDA, CheferRollout at most 3x; camkit's LeGrad not slower than
torchcam's (by default, and with the whole graph, as torchcam keeps); on the CPU each default
method's peak memory within 2x the no-grad forward's; on CUDA each default's peak within the
whole graph's estimate where it took that path (the estimate is what the budget was held to).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit

from ._harness import (
    BenchmarkError,
    Context,
    Goal,
    Ratio,
    Row,
    Timing,
    describe_exception,
    goal_at_most,
    max_abs_diff,
    memory_rows,
    package_version,
    paired_ratio,
    rows_for_timings,
)

TITLE = "Attention methods on ViTs"
ORDER = 29

FORWARD = "no-grad forward"
ROLLOUT, CHEFER, LEGRAD = "camkit AttentionRollout", "camkit CheferRollout", "camkit LeGrad"
# target=None: the predicted class, named by one more forward without graph before LeGrad's single pass
LEGRAD_PREDICTED = "camkit LeGrad (target=None)"
TORCHCAM = "torchcam LeGrad"
# each path forced: the whole graph (faster, at the memory of every block's graph) and block by block
CHEFER_WHOLE, LEGRAD_WHOLE = 'camkit CheferRollout (path="whole")', 'camkit LeGrad (path="whole")'
CHEFER_BLOCKWISE, LEGRAD_BLOCKWISE = 'camkit CheferRollout (path="blockwise")', 'camkit LeGrad (path="blockwise")'
FORCED = {CHEFER_WHOLE: "whole", LEGRAD_WHOLE: "whole", CHEFER_BLOCKWISE: "blockwise", LEGRAD_BLOCKWISE: "blockwise"}
IMPLS = (FORWARD, ROLLOUT, CHEFER, LEGRAD, LEGRAD_PREDICTED, *FORCED, TORCHCAM)
# the gradient methods as a user gets them (block by block on the CPU): probed for live memory too on the CPU, and
# alone on the large CPU model
GRADIENT = (CHEFER, LEGRAD, LEGRAD_PREDICTED)
# the implementations with a memory goal
GOVERNED = (ROLLOUT, *GRADIENT)

ROLLOUT_LIMIT = 1.3
GRADIENT_LIMIT = 4.0
CUDA_CHEFER_LIMIT = 3.0
MEMORY_LIMIT = 2.0
LEGRAD_LIMIT = 1.0
REPEATS = 3
# glibc's malloc keeps freed blocks of up to 32 MiB in the process once its dynamic mmap threshold has risen, so
# the resident peak also counts memory that is free again; with the threshold fixed at 64 KiB every tensor of
# that size or more is its own mapping, returned when freed, and the resident peak is the live memory's peak
LIVE_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
LIVE = "live memory (MALLOC_MMAP_THRESHOLD_=65536)"
#: fresh processes per default-allocator peak of the forward and the methods with a memory goal (CPU):
#: under glibc's default settings one process's peak moves by tens of MiB (vit_small's no-grad forward
#: gave 29.0, 52.0 and 31.2 MiB in three identical processes, 2026-11-27); live memory does not move
MEMORY_REPEATS = 3


@dataclass(frozen=True)
class Config:
    model: str
    size: int
    batch: int
    timed: bool = True

    @property
    def where(self) -> str:
        return f"{self.model} {self.size}x{self.size}"


def configs(ctx: Context) -> list[Config]:
    """CPU: timm's vit_small and torchvision's vit_b_16 at 224, batch 8; vit_l_16 for memory. CUDA: vit_b_16 and
    vit_l_16 at batch 8 and 32. Tiny with ``--smoke``."""
    if ctx.smoke:
        return [Config("torchvision tiny ViT", 32, 2), Config("timm tiny ViT", 32, 2)]
    if ctx.device.type == "cuda":
        return [Config(model, 224, batch) for model in ("vit_b_16", "vit_l_16") for batch in (8, 32)]
    return [Config("vit_small_patch16_224", 224, 8), Config("vit_b_16", 224, 8), Config("vit_l_16", 224, 8, timed=False)]


def build_model(name: str, device: torch.device | str = "cpu") -> nn.Module:
    """A model of this case by name, randomly initialised, seeded, in eval mode."""
    torch.manual_seed(0)
    if name in ("vit_b_16", "vit_l_16", "torchvision tiny ViT"):
        from torchvision.models import VisionTransformer, vit_b_16, vit_l_16

        model: nn.Module = (
            vit_b_16(weights=None) if name == "vit_b_16"
            else vit_l_16(weights=None) if name == "vit_l_16"
            else VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64)
        )
        nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts it at zero: all gradients would be 0
    elif name in ("vit_small_patch16_224", "timm tiny ViT"):
        import timm

        kwargs = {} if name == "vit_small_patch16_224" else dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
        model = timm.create_model("vit_small_patch16_224", pretrained=False, **kwargs)
    else:
        raise ValueError(f"unknown model {name!r}")
    return model.eval().to(device)


def random_input(batch: int, size: int, device: torch.device | str = "cpu", seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g).to(device)


def _torchvision(model: nn.Module) -> bool:
    return hasattr(model, "encoder") and hasattr(model, "heads")


@dataclass
class Prepared:
    run: Callable[[], Any]
    maps: Callable[[Any], Tensor] | None
    close: Callable[[], None]


def _nothing() -> None:
    return None


def _maps(out: camkit.Explanation) -> Tensor:
    return out.maps


def path_note(out: Any) -> str:
    """Which path a camkit explanation took, with the whole graph's estimate and the budget; "" for others."""
    extras = getattr(out, "extras", {})
    if "path" not in extras:
        return ""
    mib = {k: "n/a" if extras[k] is None else f"{extras[k] / 2**20:.0f} MiB" for k in ("estimated_bytes", "budget_bytes")}
    return f"path {extras['path']} (whole graph estimated {mib['estimated_bytes']}, budget {mib['budget_bytes']})"


def prepare(impl: str, model: nn.Module, x: Tensor, classes: Tensor) -> Prepared:
    """Build ``impl`` to explain ``classes`` (one per image); torchcam on its own copy of the model."""
    size = tuple(x.shape[2:])
    if impl == FORWARD:

        def forward() -> Tensor:
            with torch.no_grad():
                return model(x)

        return Prepared(forward, None, _nothing)
    if impl in (ROLLOUT, CHEFER, LEGRAD):
        cls = {ROLLOUT: camkit.AttentionRollout, CHEFER: camkit.CheferRollout, LEGRAD: camkit.LeGrad}[impl]
        explainer = cls(model)
        return Prepared(lambda: explainer.explain(x, classes), _maps, _nothing)
    if impl == LEGRAD_PREDICTED:  # the same classes: each image's top-1 is its predicted class
        predicted = camkit.LeGrad(model)
        return Prepared(lambda: predicted.explain(x), _maps, _nothing)
    if impl in FORCED:
        cls = camkit.CheferRollout if impl in (CHEFER_WHOLE, CHEFER_BLOCKWISE) else camkit.LeGrad
        forced = cls(model, path=FORCED[impl])
        return Prepared(lambda: forced.explain(x, classes), _maps, _nothing)
    if impl == TORCHCAM:
        if not _torchvision(model):
            raise BenchmarkError("torchcam's LeGrad takes torchvision's VisionTransformer only")
        from torchcam.methods import LeGrad as TCLeGrad

        own = copy.deepcopy(model)
        extractor = TCLeGrad(own, list(own.encoder.layers))
        class_list = classes.tolist()

        def torchcam_call() -> Tensor:
            return extractor(class_list, own(x), normalized=False)[0].detach()

        def finish(out: Tensor) -> Tensor:
            up = F.interpolate(out[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]
            lo = up.amin(dim=(1, 2), keepdim=True)
            return (up - lo) / (up.amax(dim=(1, 2), keepdim=True) - lo)

        return Prepared(torchcam_call, finish, extractor.remove_hooks)
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def label(impl: str) -> str:
    if impl == TORCHCAM:
        version = package_version("torchcam")
        return f"torchcam {version} LeGrad" if version else impl
    return impl


def top1(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return model(x).argmax(dim=1)


def memory_job(device: torch.device, impl: str, model: str, batch: int, size: int) -> Callable[[], Any]:
    """Probe job: build ``impl`` on ``model``; warm it up at batch 1, return one call at ``batch``."""
    net = build_model(model, device)
    small = random_input(1, size, device, seed=1)
    warm = prepare(impl, net, small, top1(net, small))
    warm.run()
    warm.close()
    del warm
    x = random_input(batch, size, device)
    return prepare(impl, net, x, top1(net, x)).run


def _usable(ctx: Context, model: nn.Module) -> list[str]:
    """The implementations to run: the forced path the default does not take on this device (the CPU's default is
    block by block, CUDA's the whole graph where it fits), and torchcam where it applies."""
    other = "blockwise" if ctx.device.type == "cuda" else "whole"
    return [
        i for i in IMPLS
        if (i not in FORCED or FORCED[i] == other) and (i != TORCHCAM or (ctx.available("torchcam") and _torchvision(model)))
    ]


def _time_config(ctx: Context, cfg: Config) -> tuple[list[Row], dict[str, Timing], dict[str, float], dict[str, Any]]:
    """Time rows and timings; on CUDA also each implementation's peak memory (MiB) above its built state, by
    CUDA's counter in this process; and the explanation each camkit implementation gave in the warm-up round."""
    net = build_model(cfg.model, ctx.device)
    x = random_input(cfg.batch, cfg.size, ctx.device)
    classes = top1(net, x)
    prepared: dict[str, Prepared] = {}
    outputs: dict[str, Any] = {}
    rows: list[Row] = []
    for impl in _usable(ctx, net):
        try:
            p = prepare(impl, net, x, classes)
            outputs[impl] = p.run()  # the warm-up round
        except Exception as exc:  # reported, not fatal
            rows.append(Row(TITLE, label(impl), cfg.where, cfg.batch, ctx.device.type, note=describe_exception(exc)))
            ctx.log(f"    {impl}: skipped ({describe_exception(exc)})")
            continue
        prepared[impl] = p
        if path_note(outputs[impl]):
            ctx.log(f"    {impl}: {path_note(outputs[impl])}")
    diffs: dict[str, float] = {}
    if TORCHCAM in prepared and LEGRAD in outputs:
        maps = prepared[TORCHCAM].maps
        assert maps is not None
        diffs[label(TORCHCAM)] = max_abs_diff(outputs[LEGRAD].maps, maps(outputs[TORCHCAM]))
        ctx.log(f"    max |camkit LeGrad - torchcam LeGrad| = {diffs[label(TORCHCAM)]:.2e}")
    explained = {impl: out for impl, out in outputs.items() if path_note(out)}
    outputs.clear()
    try:
        timings = ctx.time({label(i): p.run for i, p in prepared.items()},
                           repeats=ctx.repeats if ctx.smoke else REPEATS, warmup=0)
        peaks = _cuda_peaks(ctx, prepared) if ctx.device.type == "cuda" else {}
    finally:
        for p in prepared.values():
            p.close()
    if FORWARD not in prepared:
        return rows, {}, peaks, explained
    notes = {label(i): path_note(out) for i, out in explained.items()}
    rows = rows_for_timings(TITLE, timings, reference=FORWARD, model=cfg.where, batch=cfg.batch, device=ctx.device,
                            camkit=LEGRAD, diffs=diffs, notes=notes) + rows
    return rows, timings, peaks, explained


def _cuda_peaks(ctx: Context, prepared: dict[str, Prepared]) -> dict[str, float]:
    """Each implementation's peak memory (MiB) above the memory allocated before its call, one call each."""
    peaks = {}
    for impl, p in prepared.items():
        torch.cuda.synchronize(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
        base = torch.cuda.memory_allocated(ctx.device)
        out = p.run()
        torch.cuda.synchronize(ctx.device)
        peaks[label(impl)] = (torch.cuda.max_memory_allocated(ctx.device) - base) / 2**20
        del out
        ctx.log(f"    {label(impl)}: peak {peaks[label(impl)]:.1f} MiB above {base / 2**20:.0f} MiB allocated")
    return peaks


def _peaks(ctx: Context, cfg: Config, impls: Sequence[str], where: str, probe_env: dict[str, str] | None = None,
           repeats: int = 1) -> tuple[list[Row], dict[str, Ratio]]:
    """Peak-memory rows of ``impls`` and each one's ratio to the no-grad forward's peak.

    ``repeats`` > 1: the forward and the methods with a memory goal are probed in that many rounds
    of fresh processes (the others once); a row gives the median peak with its min-max in the note,
    and a ratio is the median of the rounds' ratios, their min-max its spread.
    """
    runs = {label(impl): {"impl": impl, "model": cfg.model, "batch": cfg.batch, "size": cfg.size} for impl in impls}
    rounds: list[dict[str, float]] = []
    notes: dict[str, str] = {}
    for round_ in range(repeats):
        todo = {n: p for n, p in runs.items() if n not in notes and (round_ == 0 or n in (FORWARD, *GOVERNED))}
        got, failed = ctx.peaks(f"{__name__}:memory_job", todo, probe_env=probe_env)
        rounds.append(got)
        notes.update(failed)
    samples = {n: [r[n] for r in rounds if n in r] for n in runs}
    peaks = {n: statistics.median(s) for n, s in samples.items() if s}
    ratios: dict[str, Ratio] = {}
    for n in peaks:
        per = [r[n] / r[FORWARD] for r in rounds if n in r and r.get(FORWARD)]
        if per:
            ratios[n] = Ratio(statistics.median(per), min(per), max(per))
    spreads = {n: f"median of {len(s)} processes ({min(s):.1f}-{max(s):.1f} MiB)" for n, s in samples.items() if len(s) > 1}
    rows = [
        dataclasses.replace(row, ratio=ratios[row.impl]) if row.ratio is not None and row.impl in ratios else row
        for row in memory_rows(TITLE, peaks, reference=FORWARD, model=where, batch=cfg.batch, device=ctx.device,
                               camkit=LEGRAD, notes=spreads)
    ]
    rows += [Row(TITLE, impl, where, cfg.batch, ctx.device.type, note=n) for impl, n in notes.items()]
    return rows, ratios


def _memory_config(ctx: Context, cfg: Config) -> tuple[list[Row], dict[str, Ratio], dict[str, Ratio]]:
    """Peak memory under the default allocator; on the CPU also the live memory's peak (:data:`LIVE_ENV`)."""
    if ctx.smoke:
        impls = [FORWARD, ROLLOUT]
    elif not cfg.timed:  # the large model: the block-by-block methods against the forward
        impls = [FORWARD, *GRADIENT]
    else:
        impls = _usable(ctx, build_model(cfg.model))
    cpu = ctx.device.type == "cpu" and not ctx.smoke
    rows, peaks = _peaks(ctx, cfg, impls, cfg.where, repeats=MEMORY_REPEATS if cpu else 1)
    live: dict[str, Ratio] = {}
    if cpu:
        live_rows, live = _peaks(ctx, cfg, [FORWARD, *GRADIENT], f"{cfg.where}, {LIVE}", LIVE_ENV)
        rows += live_rows
    return rows, peaks, live


def _memory_goals(ratios: dict[str, Ratio], impls: Sequence[str], where: str, *, what: str = "peak memory",
                  missing: str = "its memory probe failed") -> list[Goal]:
    """One goal per method of ``impls``: its peak within :data:`MEMORY_LIMIT` x the no-grad forward's (``ratios``)."""
    return [
        goal_at_most(
            TITLE, f"{impl} {what} within {MEMORY_LIMIT}x a no-grad forward's ({where})",
            ratios.get(impl), MEMORY_LIMIT, reason="" if impl in ratios else missing,
        )
        for impl in impls
    ]


def _live_goals(where: str, live: dict[str, Ratio]) -> list[Goal]:
    return _memory_goals(live, GRADIENT, f"{where}; {LIVE}", what="peak of live memory") if live else []


def _within_estimate(cfg: Config, cuda_peaks: dict[str, float], explained: dict[str, Any]) -> list[Goal]:
    """CUDA: each default gradient method that took the whole graph, its peak within the estimate the budget held."""
    out = []
    for impl in GRADIENT:
        extras = getattr(explained.get(impl), "extras", {})
        if extras.get("path") != "whole":
            continue
        estimate, peak = extras.get("estimated_bytes"), cuda_peaks.get(label(impl))
        out.append(goal_at_most(
            TITLE, f"{impl} (whole graph) peak memory within its estimate ({cfg.where}, batch {cfg.batch}; "
            "ratio = peak / estimate)",
            Ratio.exact(peak * 2**20 / estimate) if peak is not None and estimate else None, 1.0,
        ))
    return out


def goals(cfg: Config, timings: dict[str, Timing], peaks: dict[str, Ratio], live: dict[str, Ratio] | None = None,
          *, cuda: bool = False) -> list[Goal]:
    """The time goals for one configuration, and on the CPU its memory goals: ``peaks`` and ``live`` (measured
    with :data:`LIVE_ENV`) hold each method's peak-memory ratio to the no-grad forward's."""
    where = f"{cfg.where}, batch {cfg.batch}"
    out = []
    fwd_t = timings.get(FORWARD)
    if not cfg.timed:
        return _memory_goals(peaks, GRADIENT, where) + _live_goals(where, live or {})
    chefer = CUDA_CHEFER_LIMIT if cuda else GRADIENT_LIMIT
    limits = ((ROLLOUT, ROLLOUT_LIMIT), (CHEFER, chefer), (LEGRAD, GRADIENT_LIMIT), (LEGRAD_PREDICTED, GRADIENT_LIMIT))
    for impl, limit in limits:
        mine_t = timings.get(impl)
        out.append(goal_at_most(
            TITLE, f"{impl.removeprefix('camkit ')} at most {limit}x a no-grad forward ({where})",
            paired_ratio(mine_t, fwd_t) if mine_t and fwd_t else None, limit,
        ))
    theirs = timings.get(label(TORCHCAM))
    missing = "" if theirs else "torchcam's LeGrad takes torchvision's ViT only (or torchcam is not installed)"
    # the default, and like for like: torchcam keeps every block's graph, as camkit's whole graph does (on CUDA the
    # default takes it where it fits)
    pairs = [(LEGRAD, "camkit LeGrad")]
    if not cuda:
        pairs.append((LEGRAD_WHOLE, "camkit LeGrad (path='whole': every block's graph, as torchcam keeps)"))
    for impl, what in pairs:
        ours = timings.get(impl)
        out.append(goal_at_most(
            TITLE, f"{what} not slower than torchcam's ({where}; ratio = camkit / torchcam)",
            paired_ratio(ours, theirs) if ours and theirs else None, LEGRAD_LIMIT, reason=missing,
        ))
    if cuda:
        return out
    out += _memory_goals(peaks, GOVERNED, where,
                         missing="memory not measured for this configuration (--smoke) or its probe failed")
    return out + _live_goals(where, live or {})


def run(ctx: Context) -> Sequence[Row | Goal]:
    results: list[Row | Goal] = []
    goal_list: list[Goal] = []
    cuda = ctx.device.type == "cuda"
    for cfg in configs(ctx):
        if "timm" in cfg.model or cfg.model.startswith("vit_small"):
            if importlib.util.find_spec("timm") is None:
                results.append(Row(TITLE, LEGRAD, cfg.where, cfg.batch, ctx.device.type, note="timm is not installed"))
                continue
        ctx.log(f"  {TITLE}: {cfg.where}, batch {cfg.batch}")
        time_rows, timings, cuda_peaks, explained = _time_config(ctx, cfg) if cfg.timed else ([], {}, {}, {})
        if cuda:  # exact, measured in the timing's process
            mem_rows = memory_rows(TITLE, cuda_peaks, reference=FORWARD, model=cfg.where, batch=cfg.batch,
                                   device=ctx.device, camkit=LEGRAD)
            peaks, live = {}, {}
            goal_list += _within_estimate(cfg, cuda_peaks, explained)
        else:
            mem_rows, peaks, live = _memory_config(ctx, cfg)
        results += time_rows + mem_rows
        goal_list += goals(cfg, timings, peaks, live, cuda=cuda)
    return results + goal_list
