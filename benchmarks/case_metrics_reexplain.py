"""Case 32: the metrics that re-explain (robustness, randomisation) against their floor and Quantus 0.6.0.

Their floor is not the model's forwards but the explanations they must compute: each metric
is run once through an explainer (and a model) wrapper that keeps a copy of every chunk it
is given; the floor replays exactly those explainer calls (and ``torch.no_grad()`` forwards)
in the same chunks. The ratio is what drawing, packing and comparing add; goal at most 1.2x.
The explainer is camkit's ``Saliency`` (one backward per chunk).

Where Quantus computes the same thing (``MaxSensitivity``, ``AvgSensitivity``,
``LocalLipschitzEstimate``, ``RelativeOutputStability``, ``RandomLogit``), its class is timed on
the same inputs with the same explainer, one Quantus batch, ``normalise=False``; Quantus explains one perturbation of the whole batch per call,
camkit packs perturbations x samples into chunks. Goal: camkit never slower. Both get the explained
classes' maps computed beforehand (Quantus's ``a_batch``, camkit's ``maps=`` of random logit) and,
for random logit, the number of classes (without it camkit runs the model once to read it).

Metrics: max and average sensitivity, local Lipschitz, continuity (deterministic translations,
floor only: Quantus's ``Continuity`` scores patches, another quantity), relative input and output
stability, random logit. Models: torchvision's resnet18 (112x112, 2 images) and r3d_18 (8 frames
of 56x56, 1 clip, max sensitivity, continuity and relative input stability, against the floor only).
resnet18 runs at 112x112 (as the ``metrics`` case): at 224x224 the case ran for over 50 minutes on
the shared 2-core machine without finishing (Quantus's relative output stability alone took minutes
per call), so the default size was halved. ``--smoke``: resnet18 at 32x32, max sensitivity only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import camkit
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

TITLE = "Re-explaining metrics"
ORDER = 32

FLOOR = "bare explanations and forwards (same inputs, same chunks)"
CAMKIT = "camkit"
FLOOR_LIMIT = 1.2
SAMPLES = 8


class _Recorder(nn.Module):
    """The model, keeping a copy of every input chunk it is given."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.inputs: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        self.inputs.append(x.detach().clone())
        return self.model(x)


class _ExplainRecorder:
    """An explainer, keeping every (inputs, target) it is called with."""

    def __init__(self, explainer: Callable[..., Tensor]) -> None:
        self.explainer = explainer
        self.calls: list[tuple[Tensor, Any]] = []

    def __call__(self, x: Tensor, target: Any) -> Tensor:
        self.calls.append((x.detach().clone(), target))
        return self.explainer(x, target)


def _specs(chunk: int, maps: Tensor, classes: int) -> dict[str, Callable[[Any, nn.Module, Tensor, Tensor], Tensor]]:
    """The metric calls; random logit gets what Quantus's is given: the explained classes' ``maps``
    (Quantus's ``a_batch``) and the number of ``classes`` (its ``num_classes``)."""
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731 - a fresh generator per call
    return {
        "max_sensitivity": lambda e, m, x, y: metrics.max_sensitivity(
            e, x, y, samples=SAMPLES, radius=0.02, generator=g(), chunk_size=chunk),
        "avg_sensitivity": lambda e, m, x, y: metrics.avg_sensitivity(
            e, x, y, samples=SAMPLES, radius=0.02, generator=g(), chunk_size=chunk),
        "continuity": lambda e, m, x, y: metrics.continuity(e, x, y, steps=SAMPLES, chunk_size=chunk),
        "local_lipschitz_estimate": lambda e, m, x, y: metrics.local_lipschitz_estimate(
            e, x, y, samples=SAMPLES, std=0.05, generator=g(), chunk_size=chunk),
        "relative_input_stability": lambda e, m, x, y: metrics.relative_input_stability(
            e, m, x, y, samples=SAMPLES, generator=g(), chunk_size=chunk),
        "relative_output_stability": lambda e, m, x, y: metrics.relative_output_stability(
            e, m, x, y, samples=SAMPLES, generator=g(), chunk_size=chunk),
        "random_logit": lambda e, m, x, y: metrics.random_logit(
            e, m, x, y, maps=maps, num_classes=classes, generator=g(), chunk_size=chunk, similarity=metrics.spearman),
    }  # fmt: skip


def _quantus(name: str, model: nn.Module, x: Tensor, y: Tensor, explain: Callable[..., Tensor]) -> Callable[[], Any]:
    import quantus

    def explain_func(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, **kwargs: Any) -> np.ndarray:
        return (
            explain(torch.as_tensor(inputs, device=x.device), torch.as_tensor(targets, device=x.device))[:, None]
            .cpu()
            .numpy()
        )

    kwargs: dict[str, Any] = {
        "MaxSensitivity": {"nr_samples": SAMPLES, "lower_bound": 0.02},
        "AvgSensitivity": {"nr_samples": SAMPLES, "lower_bound": 0.02},
        "RelativeOutputStability": {"nr_samples": SAMPLES},
        "LocalLipschitzEstimate": {"nr_samples": SAMPLES, "perturb_std": 0.05, "abs": False},
        "RandomLogit": {"num_classes": 1000, "similarity_func": quantus.similarity_func.correlation_spearman},
    }[name]
    metric = getattr(quantus, name)(normalise=False, disable_warnings=True, **kwargs)
    x_np, y_np = x.cpu().numpy(), y.cpu().numpy()
    a_np = explain(x, y)[:, None].cpu().numpy()

    def call() -> Any:
        np.random.seed(0)
        return metric(model=model, x_batch=x_np, y_batch=y_np, a_batch=a_np, explain_func=explain_func,
                      device=str(x.device), batch_size=x.shape[0])  # fmt: skip

    return call


_QUANTUS = {"max_sensitivity": "MaxSensitivity", "avg_sensitivity": "AvgSensitivity",
            "local_lipschitz_estimate": "LocalLipschitzEstimate", "relative_output_stability": "RelativeOutputStability",
            "random_logit": "RandomLogit"}  # fmt: skip


def run(ctx: Context) -> list[Row | Goal]:
    out: list[Row | Goal] = []
    configs = [("resnet18", (3, 32, 32), 2, True)] if ctx.smoke else [
        ("resnet18", (3, 112, 112), 2, True), ("r3d_18", (3, 8, 56, 56), 1, False)]  # fmt: skip
    for name, shape, batch, with_quantus in configs:
        model = build_model(name, ctx.device)
        x = torch.randn(batch, *shape, generator=torch.Generator().manual_seed(0)).to(ctx.device)
        with torch.no_grad():
            logits = model(x)
        y = logits.argmax(dim=1)
        explain = camkit.Saliency(model)
        label = f"{name} {'x'.join(map(str, shape[1:]))}"
        specs = _specs(chunk=16, maps=explain(x, y).detach(), classes=logits.shape[1])
        if ctx.smoke:
            specs = {k: v for k, v in specs.items() if k == "max_sensitivity"}
        elif not with_quantus:
            specs = {k: v for k, v in specs.items() if k in ("max_sensitivity", "continuity", "relative_input_stability")}
        for metric, fn in specs.items():
            recorder, model_recorder = _ExplainRecorder(explain), _Recorder(model)
            fn(recorder, model_recorder, x, y)
            calls, forwards = recorder.calls, model_recorder.inputs

            def floor(
                calls: list = calls, forwards: list = forwards, explain: Any = explain, model: nn.Module = model
            ) -> object:
                maps = [explain(c, t) for c, t in calls]
                with torch.no_grad():
                    return maps, [model(f) for f in forwards]

            def ours(
                fn: Callable = fn, explain: Any = explain, model: nn.Module = model, x: Tensor = x, y: Tensor = y
            ) -> object:
                return fn(explain, model, x, y)

            fns: dict[str, Callable[[], object]] = {FLOOR: floor, CAMKIT: ours}
            notes = {CAMKIT: f"{metric}, {sum(len(c) for c, _ in calls)} explanations in {len(calls)} calls, "
                              f"{sum(len(f) for f in forwards)} forwards"}  # fmt: skip
            qname = f"quantus {package_version('quantus')} {_QUANTUS.get(metric)}"
            if with_quantus and metric in _QUANTUS and ctx.available("quantus"):
                try:
                    fns[qname] = _quantus(_QUANTUS[metric], model, x, y, explain)
                except Exception as exc:  # an anchor that cannot run becomes a note, not a crash
                    notes[qname] = describe_exception(exc)
            timings = ctx.time(fns)
            out += rows_for_timings(TITLE, timings, reference=FLOOR, model=f"{label}: {metric}", batch=batch,
                                    device=ctx.device, notes={k: v for k, v in notes.items() if k in timings})  # fmt: skip
            out.append(goal_at_most(TITLE, f"{metric} ({label}) within {FLOOR_LIMIT}x of its floor",
                                    paired_ratio(timings[CAMKIT], timings[FLOOR]), FLOOR_LIMIT))  # fmt: skip
            if qname in timings:
                out.append(goal_at_most(TITLE, f"{metric} ({label}) not slower than Quantus",
                                        paired_ratio(timings[CAMKIT], timings[qname]), 1.0))  # fmt: skip
    return out
