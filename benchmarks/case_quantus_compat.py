"""Case 33: every class of ``camkit.compat.quantus`` against Quantus 0.6.0 and against its floor.

Each class is called as Quantus's is (numpy batches, one Quantus batch, maps ``[B, 1, *S]``,
``normalise=False`` where the class takes it, baseline 0) by camkit's compat layer and by
Quantus, interleaved, on the same inputs; and beside its **floor**: the model calls camkit's
call makes, replayed bare (recorded once through a model wrapper that keeps a copy of every
chunk it is given): a ``torch.no_grad()`` forward per chunk scored, a forward and an input
gradient per chunk an explanation runs (the explanations here are plain input gradients,
``|d score / d x|`` summed over channels, the same function for both libraries). Goals: camkit
at most 1.2x its floor, and not slower than Quantus. A class with no model call (complexity,
localisation) has no floor; it is compared with Quantus only. Each row's note counts the
images each library ran through the model. Where camkit computes something else than Quantus
(each class's docstring says where), the counts differ and the note says so: the ratio to
Quantus is then the price of the other computation, not of the implementation.

Default: torchvision's resnet18 at 32x32, 4 images (on CUDA also SensitivityN at 64x64, 32 images);
``--smoke``: 2 images, three classes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

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

TITLE = "camkit.compat.quantus against Quantus"
ORDER = 33

FLOOR = "bare model calls (camkit's, replayed)"
CAMKIT = "camkit.compat.quantus"
FLOOR_LIMIT = 1.2


class _Recording:
    """Keep every input the model is given (and whether a gradient is being taken) in ``calls``.

    A forward pre-hook, so that the model's module names and modes stay as they are; the deep
    copies the randomisation metrics make carry the hook, and record into the same list.
    """

    def __init__(self, model: nn.Module, keep: bool = True) -> None:
        self.model, self.keep = model, keep
        self.calls: list[tuple[Tensor, bool]] = []

    def __enter__(self) -> list[tuple[Tensor, bool]]:
        def record(module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]
            grad = torch.is_grad_enabled() and x.requires_grad
            self.calls.append((x.detach().clone() if self.keep else x.new_empty(x.shape[0], 0), grad))

        self.handle = self.model.register_forward_pre_hook(record)
        return self.calls

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def saliency(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, **kwargs: Any) -> np.ndarray:
    """Quantus's ``explain_func`` contract: ``|d score / d x|`` summed over channels, [B, 1, *S] numpy."""
    device = next(model.parameters()).device
    x = torch.as_tensor(np.asarray(inputs), dtype=torch.float32, device=device).requires_grad_(True)
    y = torch.as_tensor(np.asarray(targets), dtype=torch.long, device=device).view(-1)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(model(x).gather(1, y[:, None]).sum(), x)
    return grad.abs().sum(dim=1, keepdim=True).detach().cpu().numpy()


@dataclass(frozen=True)
class Spec:
    """One class: its constructor arguments (both libraries) and what its call needs."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    maps: bool = True  # a_batch given (else the class explains)
    explain: bool = False  # explain_func given
    regions: bool = False  # s_batch given
    call: dict[str, Any] = field(default_factory=dict)
    differs: bool = False  # camkit computes something else (the class docstring says what)
    channels: bool = False  # maps on every channel, no ties (ranked element by element)
    besides: str = ""  # work beyond the model calls that any implementation does (not in the floor)


def specs(side: int, channels: int) -> list[Spec]:
    """The classes, sized to run a few dozen model calls each on ``side x side`` inputs."""
    positions = side * side
    step = positions // 4  # 4 * C steps over every element
    return [
        Spec("PixelFlipping", {"features_in_step": step, "perturb_baseline": 0.0}, channels=True),
        Spec("FaithfulnessCorrelation", {"nr_runs": 16, "subset_size": positions // 8, "perturb_baseline": 0.0}, channels=True),
        Spec("FaithfulnessEstimate", {"features_in_step": step, "perturb_baseline": 0.0}, channels=True),
        Spec("Monotonicity", {"features_in_step": step, "perturb_baseline": 0.0}, differs=True, channels=True),
        Spec("MonotonicityCorrelation", {"features_in_step": step, "nr_samples": 4}, channels=True),
        Spec("Infidelity", {"perturb_patch_sizes": [side // 4], "n_perturb_samples": 4, "perturb_baseline": 0.0},
             differs=True, channels=True),
        Spec("SensitivityN", {"features_in_step": positions // 8, "perturb_baseline": 0.0}, differs=True, channels=True),
        Spec("Completeness", {"perturb_baseline": 0.0}, channels=True),
        Spec("NonSensitivity", {"features_in_step": step, "perturb_baseline": 0.0}, channels=True),
        Spec("InputInvariance", {}, maps=False, explain=True, differs=True),
        Spec("Sparseness"), Spec("Complexity"), Spec("EffectiveComplexity", {"eps": 0.5}),
        Spec("PointingGame", regions=True), Spec("AttributionLocalisation", regions=True),
        Spec("TopKIntersection", {"k": positions // 8}, regions=True), Spec("RelevanceRankAccuracy", regions=True),
        Spec("RelevanceMassAccuracy", regions=True), Spec("AUC", regions=True),
        Spec("RegionPerturbation", {"patch_size": side // 4, "regions_evaluation": 8, "perturb_baseline": 0.0}),
        Spec("Selectivity", {"patch_size": side // 4, "perturb_baseline": 0.0}),
        Spec("IROF", {"perturb_baseline": 0.0}, besides="SLIC segments of every image"),
        Spec("ROAD", {"percentages": [10, 30, 50, 70, 90]}, differs=True,
             besides="a sparse linear solve per image and fraction (the noisy linear imputation)"),
        Spec("Sufficiency", {}),
        Spec("AvgSensitivity", {"nr_samples": 4, "lower_bound": 0.02}, explain=True),
        Spec("MaxSensitivity", {"nr_samples": 4, "lower_bound": 0.02}, explain=True),
        Spec("LocalLipschitzEstimate", {"nr_samples": 4, "perturb_std": 0.05}, explain=True),
        Spec("Continuity", {"nr_steps": 4}, explain=True),
        Spec("Consistency", {}),
        Spec("RelativeInputStability", {"nr_samples": 4}, explain=True),
        Spec("RelativeOutputStability", {"nr_samples": 4}, explain=True),
        Spec("RelativeRepresentationStability", {"nr_samples": 4, "layer_names": ["layer4.1.conv2"]}, explain=True),
        Spec("MPRT", {"layer_order": "bottom_up"}, explain=True, besides="copying the model and re-initialising its layers"),
        Spec("SmoothMPRT", {"nr_samples": 2}, explain=True, besides="copying the model and re-initialising its layers"),
        Spec("EfficientMPRT", {}, explain=True, besides="copying the model and re-initialising its layers"),
        Spec("RandomLogit", {"num_classes": 1000}, explain=True),
    ]  # fmt: skip


SMOKE = ("PixelFlipping", "Completeness", "Sparseness")


@dataclass
class Inputs:
    x: np.ndarray
    y: np.ndarray
    a: np.ndarray
    a_channels: np.ndarray
    s: np.ndarray
    device: str


def _instance(lib: Any, spec: Spec) -> Any:
    cls = getattr(lib, spec.name)
    kwargs = dict(spec.kwargs)
    if "normalise" in _parameters(cls):
        kwargs.setdefault("normalise", False)
    if lib.__name__ == "quantus":
        kwargs["disable_warnings"] = True
    return cls(**kwargs)


def _parameters(cls: type) -> set[str]:
    import inspect

    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters)
    return names


def _call(lib: Any, spec: Spec, model: nn.Module, data: Inputs) -> Callable[[], Any]:
    metric = _instance(lib, spec)
    kwargs: dict[str, Any] = {"model": model, "x_batch": data.x, "y_batch": data.y, "device": data.device,
                              "batch_size": data.x.shape[0], **spec.call}  # fmt: skip
    kwargs["a_batch"] = None if not spec.maps else (data.a_channels if spec.channels else data.a).copy()
    if spec.regions:
        kwargs["s_batch"] = data.s
    if spec.explain:
        kwargs["explain_func"] = saliency

    def call() -> Any:
        np.random.seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return metric(**kwargs)

    return call


def _floor(calls: list[tuple[Tensor, bool]], model: nn.Module) -> Callable[[], object]:
    def floor() -> object:
        outs = []
        for chunk, grad in calls:
            if grad:
                with torch.enable_grad():
                    x = chunk.requires_grad_(True)
                    outs.append(torch.autograd.grad(model(x).sum(), x)[0])
            else:
                with torch.no_grad():
                    outs.append(model(chunk))
        return outs

    return floor


def _values(result: Any) -> np.ndarray | None:
    try:
        return np.asarray(result, dtype=float)
    except (TypeError, ValueError):
        return None


def _inputs(ctx: Context, model: nn.Module, batch: int, side: int) -> Inputs:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, side, side, generator=g)
    coarse = torch.rand(batch, 1, 4, 4, generator=g)
    a = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)
    a = a + 1e-4 * torch.rand(a.shape, generator=g)  # no ties: numpy's argsort orders them its own way
    a_channels = a.expand_as(x) + 1e-4 * torch.rand(x.shape, generator=g)
    s = torch.zeros(batch, 1, side, side)
    s[..., side // 4 : side // 2, side // 4 : 3 * side // 4] = 1.0
    with torch.no_grad():
        y = model(x.to(ctx.device)).argmax(dim=1).cpu()
    return Inputs(x.numpy(), y.numpy(), a.numpy(), a_channels.numpy(), s.numpy(), str(ctx.device))


def _one(ctx: Context, spec: Spec, model: nn.Module, data: Inputs, label: str, batch: int) -> list[Row | Goal]:
    import quantus

    from camkit.compat import quantus as cq

    qname = f"quantus {package_version('quantus')}"
    notes: dict[str, str] = {}
    fns: dict[str, Callable[[], object]] = {}
    diffs: dict[str, float] = {}
    try:
        with _Recording(model) as ours_calls:
            ours_value = _values(_call(cq, spec, model, data)())
        fns[CAMKIT] = _call(cq, spec, model, data)
    except Exception as exc:  # a class that cannot run becomes a note, not a crash
        return [Row(TITLE, CAMKIT, f"{label}: {spec.name}", batch, ctx.device.type, note=describe_exception(exc))]
    images = sum(len(c) for c, _ in ours_calls)
    grads = sum(len(c) for c, g in ours_calls if g)
    notes[CAMKIT] = (
        f"{spec.name}: {images} images through the model ({grads} with a gradient) in {len(ours_calls)} calls"
    )
    if ours_calls:
        fns[FLOOR] = _floor(ours_calls, model)
    try:
        with _Recording(model, keep=False) as theirs_calls:
            theirs_value = _values(_call(quantus, spec, model, data)())
        fns[qname] = _call(quantus, spec, model, data)
        theirs = sum(len(c) for c, _ in theirs_calls)
        notes[qname] = f"{theirs} images through the model" + (" (computes something else)" if spec.differs else "")
        if ours_value is not None and theirs_value is not None and ours_value.shape == theirs_value.shape:
            diffs[qname] = float(np.nanmax(np.abs(ours_value - theirs_value), initial=0.0))
    except Exception as exc:  # Quantus failing on a call camkit takes is a row too
        notes[qname] = describe_exception(exc)
    timings = ctx.time(fns)
    model_label = f"{label}: {spec.name}"
    out: list[Row | Goal] = [
        Row(TITLE, impl, model_label, batch, ctx.device.type, note=note)
        for impl, note in notes.items()
        if impl not in timings
    ]
    reference = FLOOR if FLOOR in timings else CAMKIT
    out += rows_for_timings(TITLE, timings, reference=reference, model=model_label, batch=batch, device=ctx.device, camkit=CAMKIT,
                            diffs=diffs, notes={k: v for k, v in notes.items() if k in timings})  # fmt: skip
    if FLOOR in timings:
        reason = f"the floor leaves out {spec.besides}" if spec.besides else ""
        out.append(goal_at_most(TITLE, f"{spec.name} ({label}) within {FLOOR_LIMIT}x of its floor",
                                paired_ratio(timings[CAMKIT], timings[FLOOR]), FLOOR_LIMIT, reason=reason))  # fmt: skip
    if qname in timings:
        reason = "camkit computes something else (see the class docstring)" if spec.differs else ""
        out.append(goal_at_most(TITLE, f"{spec.name} ({label}) not slower than Quantus",
                                paired_ratio(timings[CAMKIT], timings[qname]), 1.0, reason=reason))  # fmt: skip
    return out


def run(ctx: Context) -> list[Row | Goal]:
    if not ctx.available("quantus"):
        return [Row(TITLE, "skipped", device=ctx.device.type, note="quantus is not installed (pip install quantus)")]
    model = build_model("resnet18", ctx.device)
    out: list[Row | Goal] = []
    configs = [(2, 32, SMOKE)] if ctx.smoke else [(4, 32, None)]
    if ctx.device.type == "cuda" and not ctx.smoke:
        configs.append((32, 64, ("SensitivityN",)))  # the size the GPU measurements of SensitivityN used
    for batch, side, names in configs:
        data = _inputs(ctx, model, batch, side)
        label = f"resnet18 {side}x{side}"
        for spec in specs(side, 3):
            if names is None or spec.name in names:
                ctx.log(f"  {spec.name} ({label}, batch {batch})")
                out += _one(ctx, spec, model, data, label, batch)
    return out
