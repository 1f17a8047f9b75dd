"""Case 31: the Quantus-family metrics against their floor and against Quantus 0.6.0.

Each camkit metric is timed beside its floor: the model's ``torch.no_grad()`` forwards of
exactly the inputs the metric scores, in the same chunks (recorded once by running the
metric through a model wrapper that keeps a copy of every chunk it is given). The ratio is
what ranking, drawing, building the perturbed inputs and reading the scores add on top of
the forwards any implementation must run; goal at most 1.2x.

Where Quantus computes the same thing, its class is timed on the same inputs (numpy, maps
broadcast to the input's channels, ``normalise=False``, baseline 0, the same batch as one
Quantus batch, raw scores, maps without ties) and camkit's value is checked against it (max
abs difference). Quantus runs
one model call per perturbation step for the whole batch; goal: camkit never slower.

Models: torchvision's resnet18 (112x112, 2 images) and r3d_18 (a 3-D network: 8 frames of
56x56, 1 clip; pixel flipping, region perturbation, infidelity and completeness against their
floor only, as Quantus's image metrics do not take volumes). Every metric is set
to score 12 to 32 perturbations per sample. ``--smoke``: resnet18 at 32x32, three metrics,
1 repeat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit import metrics

from ._harness import (
    Context,
    Goal,
    Row,
    build_model,
    describe_exception,
    goal_at_most,
    package_version,
    paired_ratio,
    rows_for_timings,
)

TITLE = "Quantus-family metrics"
ORDER = 31

FLOOR = "bare forwards (same inputs, same chunks)"
CAMKIT = "camkit"
FLOOR_LIMIT = 1.2


class _Recorder(nn.Module):
    """The model, keeping a copy of every input chunk it is given."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.inputs: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        self.inputs.append(x.detach().clone())
        return self.model(x)


@dataclass(frozen=True)
class Spec:
    """One metric: camkit's call, and Quantus's class name and arguments (or None)."""

    name: str
    ours: Callable[[nn.Module, Tensor, Tensor, Tensor], Any]
    quantus: str | None = None
    quantus_kwargs: dict[str, Any] | None = None
    compare: bool = True  # the same value as Quantus's on these inputs (no draws, no difference)


def _specs(x: Tensor, chunk: int) -> list[Spec]:
    elements, positions = x[0].numel(), x[0, 0].numel()
    step = positions // 4  # 4 * C steps over every element (Quantus wants a divisor of the positions)
    side = x.shape[-1] // 4  # 4 x 4 patches (or 4 x 4 x 4 blocks of a volume... capped by depth)
    subset = max(1, elements // 10)
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731 - a fresh generator per call
    return [
        Spec("pixel_flipping", lambda m, x, a, y: metrics.pixel_flipping(m, x, a, y, features_in_step=step, chunk_size=chunk),
             "PixelFlipping", {"features_in_step": step, "perturb_baseline": 0.0}),
        Spec("faithfulness_estimate",
             lambda m, x, a, y: metrics.faithfulness_estimate(m, x, a, y, features_in_step=step, chunk_size=chunk),
             "FaithfulnessEstimate", {"features_in_step": step, "perturb_baseline": 0.0}),
        Spec("faithfulness_correlation", lambda m, x, a, y: metrics.faithfulness_correlation(
            m, x, a, y, runs=32, subset_size=subset, generator=g(), chunk_size=chunk),
             "FaithfulnessCorrelation", {"nr_runs": 32, "subset_size": subset, "perturb_baseline": 0.0,
                                         "return_aggregate": False}, compare=False),
        Spec("region_perturbation",
             lambda m, x, a, y: metrics.region_perturbation(m, x, a, y, patch_size=side, chunk_size=chunk),
             "RegionPerturbation", {"patch_size": side, "perturb_baseline": 0.0}),
        Spec("selectivity", lambda m, x, a, y: metrics.selectivity(m, x, a, y, patch_size=side, chunk_size=chunk),
             "Selectivity", {"patch_size": side, "perturb_baseline": 0.0}),
        Spec("non_sensitivity", lambda m, x, a, y: metrics.non_sensitivity(
            m, x, a, y, features_in_step=step, chunk_size=chunk)),
        Spec("infidelity", lambda m, x, a, y: metrics.infidelity(m, x, a, y, samples=16, generator=g(), chunk_size=chunk)),
        Spec("sensitivity_n", lambda m, x, a, y: metrics.sensitivity_n(
            m, x, a, y, sizes=[subset, 2 * subset], samples=16, generator=g(), chunk_size=chunk)[1]),
        Spec("completeness", lambda m, x, a, y: metrics.completeness(m, x, a, y, chunk_size=chunk),
             "Completeness", {"perturb_baseline": 0.0}, compare=False),
    ]  # fmt: skip


@dataclass(frozen=True)
class Config:
    model: str
    shape: tuple[int, ...]  # one input's shape
    batch: int
    quantus: bool
    chunk: int = 32


def configs(ctx: Context) -> list[Config]:
    if ctx.smoke:
        return [Config("resnet18", (3, 32, 32), 2, True)]
    return [Config("resnet18", (3, 112, 112), 2, True), Config("r3d_18", (3, 8, 56, 56), 1, False)]


def _quantus_call(name: str, kwargs: dict[str, Any], model: nn.Module, x: Tensor, a: Tensor, y: Tensor):
    import quantus

    metric = getattr(quantus, name)(normalise=False, disable_warnings=True, **kwargs)
    x_np, a_np, y_np = x.cpu().numpy(), a.cpu().numpy(), y.cpu().numpy()

    def call() -> Any:
        np.random.seed(0)
        return metric(
            model=model, x_batch=x_np, y_batch=y_np, a_batch=a_np, device=str(x.device), batch_size=x.shape[0],
            softmax=False,  # camkit's functions score raw outputs by default; Quantus's default varies by metric
        )

    return call


def run(ctx: Context) -> list[Row | Goal]:
    out: list[Row | Goal] = []
    for config in configs(ctx):
        ctx.log(f"  {config}")
        model = build_model(config.model, ctx.device)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(config.batch, *config.shape, generator=g).to(ctx.device)
        coarse = torch.rand(config.batch, 1, *(4 for _ in config.shape[1:]), generator=g).to(ctx.device)
        mode = "bilinear" if len(config.shape) == 3 else "trilinear"
        maps = F.interpolate(coarse, size=config.shape[1:], mode=mode, align_corners=False).expand_as(x)
        # no ties: numpy's argsort orders equal values its own way, so ties would make the values differ
        maps = maps + 1e-4 * torch.rand(maps.shape, generator=g).to(ctx.device)
        with torch.no_grad():
            y = model(x).argmax(dim=1)
        quantus_ok = config.quantus and ctx.available("quantus")
        label = f"{config.model} {'x'.join(map(str, config.shape[1:]))}"
        specs = _specs(x, config.chunk)
        if ctx.smoke:
            specs = [s for s in specs if s.name in ("pixel_flipping", "region_perturbation", "completeness")]
        elif not config.quantus:  # the 3-D network: four metrics, each forward costs a clip
            specs = [s for s in specs if s.name in ("pixel_flipping", "region_perturbation", "infidelity", "completeness")]
        for spec in specs:
            recorder = _Recorder(model)
            ours_value = spec.ours(recorder, x, maps, y)
            chunks = recorder.inputs

            def floor(chunks: list[Tensor] = chunks, model: nn.Module = model) -> list[Tensor]:
                with torch.no_grad():
                    return [model(chunk) for chunk in chunks]

            def ours(spec: Spec = spec, model: nn.Module = model, x: Tensor = x, maps: Tensor = maps, y: Tensor = y) -> Any:
                return spec.ours(model, x, maps, y)

            fns: dict[str, Callable[[], object]] = {FLOOR: floor, CAMKIT: ours}
            diffs: dict[str, float] = {}
            notes: dict[str, str] = {CAMKIT: f"{spec.name}, {sum(len(c) for c in chunks)} images in {len(chunks)} chunks"}
            qname = f"quantus {package_version('quantus')} {spec.quantus}"
            if quantus_ok and spec.quantus is not None:
                try:
                    call = _quantus_call(spec.quantus, spec.quantus_kwargs or {}, model, x, maps, y)
                    theirs = np.asarray(call(), dtype=float)
                    if spec.compare:
                        diffs[qname] = float(np.abs(theirs - ours_value.double().cpu().numpy()).max())
                    fns[qname] = call
                except Exception as exc:  # an anchor that cannot run becomes a note, not a crash
                    notes[qname] = describe_exception(exc)
            timings = ctx.time(fns)
            for impl, note in notes.items():
                if impl not in timings:
                    out.append(Row(case=TITLE, impl=impl, model=f"{label}: {spec.name}", batch=config.batch,
                                   device=ctx.device.type, note=note))  # fmt: skip
            out += rows_for_timings(
                TITLE, timings, reference=FLOOR, model=f"{label}: {spec.name}", batch=config.batch, device=ctx.device,
                diffs=diffs, notes={k: v for k, v in notes.items() if k in timings},
            )  # fmt: skip
            out.append(
                goal_at_most(
                    TITLE, f"{spec.name} ({label}) within {FLOOR_LIMIT}x of its floor",
                    paired_ratio(timings[CAMKIT], timings[FLOOR]), FLOOR_LIMIT,
                )
            )  # fmt: skip
            if qname in timings:
                out.append(
                    goal_at_most(
                        TITLE, f"{spec.name} ({label}) not slower than Quantus",
                        paired_ratio(timings[CAMKIT], timings[qname]), 1.0,
                    )
                )  # fmt: skip
            del chunks, recorder
    return out
