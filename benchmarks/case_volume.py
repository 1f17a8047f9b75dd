"""Case 26: Grad-CAM on a video model and a 3-D medical network, against a no-grad forward and the anchors.

Times, side by side (interleaved) on one model and batch: a ``torch.no_grad()`` forward,
``camkit.GradCAM``, pytorch-grad-cam's ``GradCAM``, captum's ``LayerGradCam`` (with
``relu_attributions=True``), torchcam's ``GradCAM`` and MONAI's ``monai.visualize.GradCAM``,
each anchor on its own deep copy of the model (MONAI's hooks cannot be removed at all).
MONAI's GradCAM scores one class index for the whole batch, so every implementation is
given the same class for every sample: the top-1 class of the first sample's no-grad forward.
Peak memory of one call is measured above the loaded model, each implementation in a fresh
process (``ctx.peak_memory``), as in case 1.

Map agreement, on the same layer: captum's raw maps and torchcam's layer-resolution maps are
passed through camkit's output contract for any rank (linear / bilinear / trilinear
upsampling with ``align_corners=False``, then per-map min-max); MONAI's default
post-processing maps (min, max) to (1, 0), so ``1 - map`` is compared. pytorch-grad-cam
normalises at the layer's resolution and then resizes with SciPy's cubic-spline ``zoom``, so
its maps as returned differ by more; its note gives the max |difference| and the Pearson
correlation with camkit's maps.

Timing: the call each implementation makes for the agreement check is the warm-up round;
then 3 interleaved rounds (``ctx.repeats`` with ``--smoke``), each call seconds long.

Default: torchvision's ``r3d_18`` (``layer4``) on batch 4 of 3x16x112x112 clips, time and
memory at batch 4. ``--full`` adds MONAI's ``DenseNet121(spatial_dims=3, in_channels=1,
out_channels=2)`` (``features.denseblock4``, its last spatial stage) on batch 2 of 1x96x96x96
volumes, kept out of the default run's time budget: pytorch-grad-cam and MONAI run a full
backward pass through its large early stages. Both randomly initialised. ``--smoke``: r3d_18 at 8x32x32,
batch 2 (memory: the forward and camkit only), and a small MONAI DenseNet-3D (same stages,
two layers per block) at 32x64x64, batch 1 (time only).
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit

from ._harness import (
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

TITLE = "Grad-CAM on video and volumes"
ORDER = 26

FORWARD = "no-grad forward"
CAMKIT = "camkit"
ANCHOR_MODULES = {
    "pytorch-grad-cam": "pytorch_grad_cam",
    "captum": "captum",
    "torchcam": "torchcam",
    "MONAI": "monai",
}
ANCHOR_DISTS = {"pytorch-grad-cam": "grad-cam", "captum": "captum", "torchcam": "torchcam", "MONAI": "monai"}
IMPLS = (FORWARD, CAMKIT, *ANCHOR_MODULES)

MEMORY_LIMIT = 1.15  # camkit's peak within 1.15x of the no-grad forward's (issue 26)
TIME_LIMIT = 1.0  # camkit's time not above the fastest anchor's (issue 26)
REPEATS = 3  # timed rounds outside --smoke: one round of r3d_18 is about 18 s on two cores (issue 26's figures)

_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


@dataclass(frozen=True)
class Config:
    """One model and input: ``shape`` is one sample's ``[C, *S]``."""

    model: str
    layer: str
    shape: tuple[int, ...]
    batch: int
    memory: bool

    @property
    def where(self) -> str:
        return f"{self.model} {'x'.join(map(str, self.shape[1:]))}"


def configs(ctx: Context) -> list[Config]:
    """The configurations of this mode; goals are given for each of them.

    The default run holds r3d_18; DenseNet121-3D at 96^3 (the anchors' full backward passes
    through its large early stages are slow on a CPU) runs with ``--full``.
    """
    if ctx.smoke:
        return [
            Config("r3d_18", "layer4", (3, 8, 32, 32), 2, True),
            Config("DenseNet-3D small", "features.denseblock4", (1, 32, 64, 64), 1, False),
        ]
    out = [Config("r3d_18", "layer4", (3, 16, 112, 112), 4, True)]
    if ctx.full:
        out.append(Config("DenseNet121-3D", "features.denseblock4", (1, 96, 96, 96), 2, True))
    return out


def build_model(name: str, device: torch.device | str = "cpu") -> nn.Module:
    """A model of this case by name, randomly initialised, seeded, in eval mode.

    ``"r3d_18"``: torchvision's video ResNet; ``"DenseNet121-3D"``: MONAI's
    ``DenseNet121(spatial_dims=3, in_channels=1, out_channels=2)``; ``"DenseNet-3D small"``:
    MONAI's ``DenseNet`` with the same stages, 16 initial features, growth 8 and two layers
    per block (the smoke run's stand-in).
    """
    torch.manual_seed(0)
    if name == "r3d_18":
        import torchvision

        model: nn.Module = torchvision.models.video.r3d_18(weights=None)
    elif name == "DenseNet121-3D":
        from monai.networks.nets import DenseNet121

        model = DenseNet121(spatial_dims=3, in_channels=1, out_channels=2)
    elif name == "DenseNet-3D small":
        from monai.networks.nets import DenseNet

        model = DenseNet(spatial_dims=3, in_channels=1, out_channels=2, init_features=16, growth_rate=8,
                         block_config=(2, 2, 2, 2))
    else:
        raise ValueError(f"unknown model {name!r}; expected 'r3d_18', 'DenseNet121-3D' or 'DenseNet-3D small'")
    return model.eval().to(device)


def random_input(batch: int, shape: Sequence[int], device: torch.device | str = "cpu", seed: int = 0) -> Tensor:
    """A seeded batch ``[batch, *shape]`` of standard normal values."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *shape, generator=g).to(device)


def finish_like_camkit(raw: Tensor | Any, size: Sequence[int]) -> Tensor:
    """camkit's output contract for any rank, applied to another library's maps.

    ``raw`` is ``[B, *s]`` or ``[B, 1, *s]`` with ``len(s) == len(size)`` (1 to 3 axes); the
    result is float32 ``[B, *size]``: linear, bilinear or trilinear upsampling
    (``align_corners=False``), then per-map min-max (a constant map becomes zeros).

    Example:
        >>> finish_like_camkit(torch.tensor([[0.0, 2.0]]), (4,))
        tensor([[0.0000, 0.2500, 0.7500, 1.0000]])
    """
    n = len(size)
    maps = torch.as_tensor(raw).detach().float().cpu()
    if maps.dim() == n + 2:
        maps = maps[:, 0]
    if maps.dim() != n + 1:
        raise ValueError(f"maps for a size with {n} axes must be [B, *s] or [B, 1, *s], got {list(maps.shape)}")
    up = F.interpolate(maps[:, None], size=tuple(size), mode=_MODES[n], align_corners=False)[:, 0]
    flat = up.flatten(1)
    lo = flat.amin(dim=1).view(-1, *[1] * n)
    span = (flat.amax(dim=1) - flat.amin(dim=1)).view(-1, *[1] * n)
    return torch.where(span > 0, (up - lo) / span.clamp_min(torch.finfo(up.dtype).tiny), torch.zeros_like(up))


def correlation(a: Tensor | Any, b: Tensor | Any) -> float:
    """Pearson correlation of two maps of the same shape, over all their values.

    Example:
        >>> round(correlation(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 3.0, 5.0])), 6)
        1.0
    """
    ta = torch.as_tensor(a).detach().cpu().double().flatten()
    tb = torch.as_tensor(b).detach().cpu().double().flatten()
    if ta.shape != tb.shape:
        raise ValueError(f"maps to correlate must have the same size, got {ta.numel()} and {tb.numel()} values")
    return float(torch.corrcoef(torch.stack([ta, tb]))[0, 1])


@dataclass
class Prepared:
    """One implementation ready to run: ``run()`` does one call; ``maps(out)`` -> ``[B, *S]`` in [0, 1]."""

    run: Callable[[], Any]
    maps: Callable[[Any], Tensor] | None
    close: Callable[[], None]


def _nothing() -> None:
    return None


def prepare(impl: str, model: nn.Module, layer: str, x: Tensor, cls: int) -> Prepared:
    """Build ``impl`` (an anchor on its own copy of ``model``) to explain class ``cls`` for every sample."""
    size = tuple(x.shape[2:])
    classes = torch.full((x.shape[0],), cls, dtype=torch.long, device=x.device)
    if impl == FORWARD:

        def forward() -> Tensor:
            with torch.no_grad():
                return model(x)

        return Prepared(forward, None, _nothing)
    if impl == CAMKIT:
        explainer = camkit.GradCAM(model, layer)
        return Prepared(lambda: explainer(x, target=classes), lambda out: out, _nothing)
    own = copy.deepcopy(model)
    if impl == "pytorch-grad-cam":
        from pytorch_grad_cam import GradCAM as PGCGradCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        cam = PGCGradCAM(model=own, target_layers=[own.get_submodule(layer)])
        targets = [ClassifierOutputTarget(cls) for _ in range(x.shape[0])]
        return Prepared(
            lambda: cam(input_tensor=x, targets=targets),
            lambda out: torch.from_numpy(out),  # already [B, *S] in [0, 1]: compared as returned
            cam.activations_and_grads.release,
        )
    if impl == "captum":
        from captum.attr import LayerGradCam

        explainer_c = LayerGradCam(own, own.get_submodule(layer))
        return Prepared(
            lambda: explainer_c.attribute(x, target=classes, relu_attributions=True).detach(),
            lambda out: finish_like_camkit(out, size),
            _nothing,
        )
    if impl == "torchcam":
        from torchcam.methods import GradCAM as TCGradCAM

        extractor = TCGradCAM(own, layer)
        class_list = classes.tolist()

        def torchcam_call() -> Tensor:
            return extractor(class_idx=class_list, scores=own(x))[0]

        # torchcam's maps are [B, *s] at the layer's grid, min-max normalised
        return Prepared(torchcam_call, lambda out: finish_like_camkit(out, size), extractor.remove_hooks)
    if impl == "MONAI":
        from monai.visualize import GradCAM as MonaiGradCAM

        cam_m = MonaiGradCAM(nn_module=own, target_layers=layer)  # default upsampler and post-processing

        def monai_close() -> None:
            # MONAI's hooks stay on its copy for good, and the last score it keeps reaches them through the
            # autograd graph, a cycle Python's garbage collector cannot see: drop what it keeps so the copy goes
            hooks = cam_m.nn_module
            hooks.score = None
            hooks.activations.clear()
            hooks.gradients.clear()

        # MONAI maps (min, max) to (1, 0): flip back before camkit's contract
        return Prepared(lambda: cam_m(x, class_idx=cls), lambda out: finish_like_camkit(1.0 - out, size), monai_close)
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def label(impl: str) -> str:
    """The implementation's name with its installed version, e.g. ``MONAI 1.6.1``."""
    dist = ANCHOR_DISTS.get(impl)
    version = package_version(dist) if dist else None
    return f"{impl} {version}" if version else impl


def first_top1(model: nn.Module, x: Tensor) -> int:
    """The top-1 class of the first sample."""
    with torch.no_grad():
        return int(model(x[:1]).argmax(dim=1)[0])


def explained_class(model: nn.Module, layer: str, x: Tensor) -> int:
    """The one class every implementation explains: the first sample's top-1, unless camkit's
    Grad-CAM of it is flat for some sample (all zero after the ReLU, as class 0 of the random
    DenseNet121-3D at 96^3 is); then the next class by the first sample's score whose maps are
    not flat. Timing and comparing flat maps would check nothing."""
    with torch.no_grad():
        order = model(x[:1])[0].argsort(descending=True).tolist()
    explainer = camkit.GradCAM(model, layer)
    for cls in order:
        if not bool(explainer.explain(x, cls).flat.any()):
            return int(cls)
    return int(order[0])


def memory_job(device: torch.device, impl: str, model: str, layer: str, batch: int, shape: list[int]) -> Callable[[], Any]:
    """Probe job: build ``impl`` on ``model`` and return one call at ``batch``.

    Warm-up: one call of the implementation at batch 1 on its own copy, released and dropped
    before the measured one is built, so the baseline holds the model, the input and the
    explainer only (for an anchor, with its copy of the model).
    """
    net = build_model(model, device)
    small = random_input(1, shape, device, seed=1)
    warm = prepare(impl, net, layer, small, explained_class(net, layer, small))
    warm.run()
    warm.close()
    del warm
    x = random_input(batch, shape, device)
    return prepare(impl, net, layer, x, explained_class(net, layer, x)).run


def _usable(ctx: Context) -> list[str]:
    return [impl for impl in IMPLS if impl not in ANCHOR_MODULES or ctx.available(ANCHOR_MODULES[impl])]


def _agreement(ctx: Context, outputs: dict[str, Any], prepared: dict[str, Prepared]) -> tuple[dict[str, float], dict[str, str]]:
    diffs: dict[str, float] = {}
    notes: dict[str, str] = {}
    ours = outputs.get(CAMKIT)
    if ours is None:
        return diffs, notes
    for impl, p in prepared.items():
        if impl in (CAMKIT, FORWARD) or p.maps is None:
            continue
        try:
            theirs = p.maps(outputs[impl])
            if impl == "pytorch-grad-cam":
                diff, corr = max_abs_diff(ours, theirs), correlation(ours, theirs)
                notes[label(impl)] = f"maps as returned (SciPy spline zoom): max diff {diff:.2e}, correlation {corr:.4f}"
                ctx.log(f"    camkit vs {impl}: max diff {diff:.2e}, correlation {corr:.4f}")
                continue
            diffs[label(impl)] = max_abs_diff(ours, theirs)
        except (RuntimeError, ValueError) as exc:
            notes[label(impl)] = f"maps not comparable: {describe_exception(exc)}"
            continue
        ctx.log(f"    max |camkit - {impl}| = {diffs[label(impl)]:.2e}")
    return diffs, notes


def _time_config(ctx: Context, cfg: Config) -> tuple[list[Row], dict[str, Timing]]:
    net = build_model(cfg.model, ctx.device)
    x = random_input(cfg.batch, cfg.shape, ctx.device)
    cls = explained_class(net, cfg.layer, x)
    prepared: dict[str, Prepared] = {}
    outputs: dict[str, Any] = {}
    rows: list[Row] = []
    for impl in _usable(ctx):
        try:
            p = prepare(impl, net, cfg.layer, x, cls)
            outputs[impl] = p.run()  # also the first warm-up call
        except Exception as exc:  # an implementation that cannot run this model is reported, not fatal
            rows.append(Row(TITLE, label(impl), cfg.where, cfg.batch, ctx.device.type, note=describe_exception(exc)))
            ctx.log(f"    {impl}: skipped ({describe_exception(exc)})")
            continue
        prepared[impl] = p
    diffs, notes = _agreement(ctx, outputs, prepared)
    outputs.clear()
    try:
        # the agreement calls above were the warm-up round
        timings = ctx.time({label(impl): p.run for impl, p in prepared.items()},
                           repeats=ctx.repeats if ctx.smoke else REPEATS, warmup=0)
    finally:
        for p in prepared.values():
            p.close()
    if FORWARD not in prepared:
        return rows, {}
    rows = rows_for_timings(
        TITLE, timings, reference=FORWARD, model=cfg.where, batch=cfg.batch, device=ctx.device,
        camkit=label(CAMKIT), diffs=diffs, notes=notes,
    ) + rows
    return rows, timings


def _memory_config(ctx: Context, cfg: Config) -> tuple[list[Row], dict[str, float]]:
    if not cfg.memory:
        return [], {}
    impls = [FORWARD, CAMKIT] if ctx.smoke else _usable(ctx)  # smoke: the two cheapest probe processes
    peaks, notes = ctx.peaks(f"{__name__}:memory_job", {
        label(impl): {"impl": impl, "model": cfg.model, "layer": cfg.layer, "batch": cfg.batch, "shape": list(cfg.shape)}
        for impl in impls
    })  # fmt: skip
    rows = memory_rows(TITLE, peaks, reference=FORWARD, model=cfg.where, batch=cfg.batch, device=ctx.device,
                       camkit=label(CAMKIT))
    rows += [Row(TITLE, impl, cfg.where, cfg.batch, ctx.device.type, note=n) for impl, n in notes.items()]
    return rows, peaks


def fastest_anchor(timings: dict[str, Timing]) -> str | None:
    """The label of the anchor with the lowest median time, or ``None`` when no anchor ran."""
    anchors = [name for name in timings if name not in (FORWARD, label(CAMKIT))]
    return min(anchors, key=lambda name: timings[name].median, default=None)


def goals(cfg: Config, timings: dict[str, Timing], peaks: dict[str, float]) -> list[Goal]:
    """Issue 26's two goals for one configuration."""
    where = f"{cfg.where}, layer {cfg.layer}, batch {cfg.batch}"
    fwd, ours = peaks.get(FORWARD), peaks.get(label(CAMKIT))
    mem_ratio = Ratio.exact(ours / fwd) if fwd and ours is not None else None
    anchor = fastest_anchor(timings)
    ours_t = timings.get(label(CAMKIT))
    time_ratio = paired_ratio(ours_t, timings[anchor]) if anchor and ours_t else None
    return [
        goal_at_most(
            TITLE, f"camkit GradCAM within {MEMORY_LIMIT}x of a no-grad forward's peak memory above the model ({where})",
            mem_ratio, MEMORY_LIMIT,
            reason="" if mem_ratio else "memory not measured for this configuration (--smoke) or its probe failed",
        ),
        goal_at_most(
            TITLE, f"camkit GradCAM time not above the fastest anchor's ({where}; ratio = camkit time / "
            f"{anchor or 'fastest anchor'} time)",
            time_ratio, TIME_LIMIT,
            reason="" if anchor else "no anchor ran (install .[bench]; or --no-anchors)",
        ),
    ]


def run(ctx: Context) -> Sequence[Row | Goal]:
    """Time and measure every configuration of this mode; goals for each."""
    results: list[Row | Goal] = []
    goal_list: list[Goal] = []
    for cfg in configs(ctx):
        if cfg.model.startswith("DenseNet") and importlib.util.find_spec("monai") is None:
            results.append(Row(TITLE, CAMKIT, cfg.where, cfg.batch, ctx.device.type,
                               note="MONAI is not installed (pip install -e '.[bench]'): model not built"))
            continue
        ctx.log(f"  {TITLE}: {cfg.where}, batch {cfg.batch}, layer {cfg.layer}")
        time_rows, timings = _time_config(ctx, cfg)
        mem_rows, peaks = _memory_config(ctx, cfg)
        results += time_rows + mem_rows
        goal_list += goals(cfg, timings, peaks)
    return results + goal_list
