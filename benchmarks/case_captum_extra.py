"""Case 18: captum 0.9's further methods, camkit beside the anchor of the same name (``--full`` only).

For each method, times side by side (interleaved): a ``torch.no_grad()`` forward of the batch,
camkit's method and captum's, captum on its own deep copy of the model, the same explicit
classes for both. Agreement: the max |difference| between camkit's ``raw`` and captum's
attribution, both defined the same way:

* ``LayerActivation``, ``LayerGradientXActivation``, ``LayerIntegratedGradients`` and
  ``LayerConductance`` at ``layer3``: camkit's ``raw`` is the layer attribution [B, C, h, w],
  as captum's. Both integrate over the same points with the same baseline (0) and chunks:
  Gauss-Legendre for integrated gradients; for conductance captum's
  ``method="riemann_trapezoid"``, which is camkit's rule (``steps`` segments, ``steps + 1``
  points including both ends).
* Neuron targets: ``camkit.Saliency`` and ``camkit.IntegratedGradients`` with
  ``NeuronTarget("layer3.1.conv2", 5, position=(2, 3))`` (the unit ``output[b, 5, 2, 3]``
  itself, no reduction; a convolution's output, so no ReLU can leave it dead) beside captum's
  ``NeuronGradient`` and ``NeuronIntegratedGradients`` at that module with
  ``neuron_selector=(5, 2, 3)``; ``raw`` is the signed input gradient (attribution) [B, 3, H, W].
* ``GradientShap`` samples baselines, path points and noise: camkit and captum draw
  differently, so only the time is compared (seeded, the same number of samples, all points in
  one batch for both); the agreement in expectation is tested in ``tests/methods/test_propagation.py``.
* ``DeepLiftShap`` runs on models without a ReLU module called twice, which captum's DeepLift
  refuses (every torchvision ResNet block calls its ``relu`` twice): on a small CNN without
  max-pooling built here (conv, batch norm, ReLU, average pooling), where the two agree to
  float precision, and on vgg11. On vgg11 they disagree: captum 0.9's attributions miss
  ``score(x) - mean_b score(b)`` by a wide margin while camkit's sum to it (the row's note
  gives both gaps). Captum's handling of max-pooling is the cause: in a small ReLU network the two disagree
  with ``nn.MaxPool2d(2)`` and agree to about 1e-9 with ``nn.AvgPool2d(2)`` in its place.

``--full``: resnet18 (random weights, batch-norm statistics and biases randomised: see
:func:`shift_batch_norms`) at 128x128, batch 2, 16 integration steps, 16 GradientShap
samples over 4 baseline images; DeepLiftShap with 3 baseline images on the small CNN and on
vgg11 at 64x64, batch 2. ``--smoke``: resnet18 at 64x64, batch 1, 4 steps and samples, the small
CNN only. The default run skips this case.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import camkit

from ._harness import (
    Context,
    Goal,
    Row,
    build_model,
    describe_exception,
    max_abs_diff,
    package_version,
    random_input,
    rows_for_timings,
)

TITLE = "captum 0.9 methods"
ORDER = 18

FORWARD = "no-grad forward"
CAMKIT = "camkit"
LAYER = "layer3"
NEURON_LAYER, NEURON_CHANNEL, NEURON_POSITION = "layer3.1.conv2", 5, (2, 3)


@dataclass(frozen=True)
class Config:
    """Image size, batch, integration steps, GradientShap samples and baselines, path points per chunk."""

    size: int
    batch: int
    steps: int
    samples: int
    baselines: int
    chunk: int


@dataclass
class Method:
    """One comparison: camkit's call, captum's (built on its own copy of the model) and how to compare them."""

    name: str
    anchor: str
    ours: Callable[[], Any]  # camkit's ``raw`` (a tensor here: one input)
    theirs: Callable[[nn.Module], Callable[[], Any]] | None
    compare: bool = True
    note: str = ""


def _captum_label(anchor: str) -> str:
    version = package_version("captum")
    return f"captum {version} {anchor}" if version else f"captum {anchor}"


def shift_batch_norms(net: nn.Module, seed: int = 0) -> nn.Module:
    """Give every batch norm seeded random statistics and bias, in place; returns ``net``.

    A freshly initialised torchvision network (batch norms the identity, no biases before
    them) is positively homogeneous, so along a path from a zero baseline its gradients do
    not change and every path integral collapses to gradient x input: the comparisons of
    integrated gradients and conductance would test nothing.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d) and m.running_mean is not None and m.running_var is not None:
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                m.running_var.copy_(0.5 + 1.5 * torch.rand(c, generator=g))
                m.bias.copy_(0.2 * torch.rand(c, generator=g) - 0.1)
    return net


def small_cnn() -> nn.Module:
    """A seeded CNN that captum's DeepLift runs as intended: every ReLU module once, no max-pooling."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for cin, cout in ((3, 32), (32, 64), (64, 128), (128, 128)):
        layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    return shift_batch_norms(net).eval()


def _resnet_methods(net: nn.Module, x: Tensor, classes: Tensor, cfg: Config) -> list[Method]:
    batch, steps, chunk = x.shape[0], cfg.steps, cfg.chunk
    bases = random_input(cfg.baselines, cfg.size, x.device, seed=1)
    neuron = camkit.NeuronTarget(NEURON_LAYER, NEURON_CHANNEL, position=NEURON_POSITION)
    selector = (NEURON_CHANNEL, *NEURON_POSITION)

    lact, lgxa = camkit.LayerActivation(net, LAYER), camkit.LayerGradientXActivation(net, LAYER)
    lig = camkit.LayerIntegratedGradients(net, LAYER, steps=steps, max_batch=chunk)
    lcond = camkit.LayerConductance(net, LAYER, steps=steps, max_batch=chunk)
    sal, ig = camkit.Saliency(net), camkit.IntegratedGradients(net, steps=steps, max_batch=chunk)
    gshap = camkit.GradientShap(net, bases, samples=cfg.samples, seed=0, max_batch=batch * cfg.samples)

    def make(anchor: str, module: str | None, call: Callable[[Any], Tensor]) -> Callable[[nn.Module], Callable[[], Tensor]]:
        """captum's ``anchor`` on the given copy of the model, at ``module`` of that copy for layer and neuron methods."""

        def build(copy_: nn.Module) -> Callable[[], Tensor]:
            import captum.attr

            cls = getattr(captum.attr, anchor)
            method = cls(copy_, copy_.get_submodule(module)) if module else cls(copy_)
            return lambda: call(method)

        return build

    def gshap_theirs(m: Any) -> Tensor:
        torch.manual_seed(0)
        out: Tensor = m.attribute(x, bases, n_samples=cfg.samples, stdevs=0.0, target=classes)
        return out

    return [
        Method("LayerActivation", "LayerActivation", lambda: lact.explain(x, classes).raw,
               make("LayerActivation", LAYER, lambda m: m.attribute(x))),
        Method("LayerGradientXActivation", "LayerGradientXActivation", lambda: lgxa.explain(x, classes).raw,
               make("LayerGradientXActivation", LAYER, lambda m: m.attribute(x, target=classes))),
        Method("LayerIntegratedGradients", "LayerIntegratedGradients", lambda: lig.explain(x, classes).raw,
               make("LayerIntegratedGradients", LAYER, lambda m: m.attribute(
                   x, baselines=0.0, target=classes, n_steps=steps, method="gausslegendre",
                   internal_batch_size=chunk)),
               note=f"{steps} Gauss-Legendre points, chunks of {chunk}"),
        Method("LayerConductance", "LayerConductance", lambda: lcond.explain(x, classes).raw,
               make("LayerConductance", LAYER, lambda m: m.attribute(
                   x, baselines=0.0, target=classes, n_steps=steps, method="riemann_trapezoid",
                   internal_batch_size=chunk)),
               note=f"riemann_trapezoid, {steps} segments, chunks of {chunk}"),
        Method("Saliency, NeuronTarget", "NeuronGradient", lambda: sal.explain(x, target=neuron).raw,
               make("NeuronGradient", NEURON_LAYER, lambda m: m.attribute(x, neuron_selector=selector)),
               note=f"{NEURON_LAYER}[:, {NEURON_CHANNEL}, {NEURON_POSITION[0]}, {NEURON_POSITION[1]}]"),
        Method("IntegratedGradients, NeuronTarget", "NeuronIntegratedGradients",
               lambda: ig.explain(x, target=neuron).raw,
               make("NeuronIntegratedGradients", NEURON_LAYER, lambda m: m.attribute(
                   x, neuron_selector=selector, baselines=0.0, n_steps=steps, method="gausslegendre",
                   internal_batch_size=chunk)),
               note=f"{NEURON_LAYER}[:, {NEURON_CHANNEL}, {NEURON_POSITION[0]}, {NEURON_POSITION[1]}], {steps} points"),
        Method("GradientShap", "GradientShap", lambda: gshap.explain(x, classes).raw,
               make("GradientShap", None, gshap_theirs), compare=False,
               note=f"{cfg.samples} samples, {cfg.baselines} baselines, different random draws: time only"),
    ]


def _completeness_gap(model: nn.Module, attribution: Tensor, x: Tensor, bases: Tensor, classes: Tensor) -> float:
    """Largest |sum(attribution) - (score(x) - mean_b score(b))| over the batch."""
    with torch.no_grad():
        want = model(x).gather(1, classes[:, None])[:, 0] - model(bases)[:, classes].mean(dim=0)
    return float((attribution.flatten(1).sum(dim=1) - want).abs().max())


def _time_method(ctx: Context, model_name: str, net: nn.Module, x: Tensor, method: Method,
                 gaps: tuple[Tensor, Tensor] | None = None) -> list[Row]:
    label = _captum_label(method.anchor)
    case = f"{TITLE}: {method.name}"

    def forward() -> Tensor:
        with torch.no_grad():
            out: Tensor = net(x)
        return out

    fns: dict[str, Callable[[], Any]] = {FORWARD: forward, CAMKIT: method.ours}
    notes: dict[str, str] = {}
    diffs: dict[str, float] = {}
    rows: list[Row] = []
    if method.theirs is not None:
        try:
            run = method.theirs(copy.deepcopy(net))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # captum's notes on hooks set on activations
                theirs = run().detach()
            fns[label] = run
        except Exception as exc:  # an anchor that cannot run is reported, not fatal
            rows.append(Row(case, label, model_name, x.shape[0], ctx.device.type, note=describe_exception(exc)))
    ours = method.ours().detach()  # also camkit's warm-up call
    note = method.note
    if label in fns and method.compare:
        diffs[label] = max_abs_diff(ours, theirs)
        note = f"{note}; " if note else ""
        note += f"largest abs raw {float(ours.abs().max()):.1e}"
        ctx.log(f"    {method.name}: max |camkit raw - captum| = {diffs[label]:.2e} (max |raw| {ours.abs().max():.2e})")
    if label in fns and gaps is not None:
        bases, classes = gaps
        ours_gap = _completeness_gap(net, ours, x, bases, classes)
        theirs_gap = _completeness_gap(net, theirs, x, bases, classes)
        note += f"; largest abs(sum - (S(x) - mean S(b))): camkit {ours_gap:.1e}, captum {theirs_gap:.1e}"
        ctx.log(f"    {method.name}: summation gap camkit {ours_gap:.2e}, captum {theirs_gap:.2e}")
    if label in fns:
        notes[label] = note
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timings = ctx.time(fns, repeats=min(ctx.repeats, 3))
    return rows_for_timings(
        case, timings, reference=FORWARD, model=model_name, batch=x.shape[0], device=ctx.device,
        camkit=CAMKIT, diffs=diffs, notes=notes,
    ) + rows


def _deepliftshap(ctx: Context, model_name: str, net: nn.Module, size: int, batch: int, baselines: int,
                  note: str) -> list[Row]:
    x = random_input(batch, size, ctx.device)
    bases = random_input(baselines, size, ctx.device, seed=1)
    with torch.no_grad():
        classes = net(x).argmax(dim=1)
    ours = camkit.DeepLiftShap(net, bases)

    def theirs(copy_: nn.Module) -> Callable[[], Tensor]:
        from captum.attr import DeepLiftShap

        method = DeepLiftShap(copy_)
        return lambda: method.attribute(x, bases, target=classes)

    method = Method(
        f"DeepLiftShap ({model_name})", "DeepLiftShap", lambda: ours.explain(x, classes).raw,
        theirs if ctx.available("captum") else None, note=f"{baselines} baselines{note}",
    )
    ctx.log(f"  {TITLE}: {method.name}, {size}x{size}, batch {batch}")
    return _time_method(ctx, model_name, net, x, method, gaps=(bases, classes))


def run(ctx: Context) -> Sequence[Row | Goal]:
    """Each method beside captum's (``--full``); all of them on tiny inputs (``--smoke``)."""
    if not (ctx.full or ctx.smoke):
        ctx.log(f"  {TITLE}: run with --full")
        return []
    if ctx.smoke:
        cfg = Config(size=64, batch=1, steps=4, samples=4, baselines=2, chunk=8)
    else:
        cfg = Config(size=128, batch=2, steps=16, samples=16, baselines=4, chunk=32)
    net = shift_batch_norms(build_model("resnet18", ctx.device))
    x = random_input(cfg.batch, cfg.size, ctx.device)
    with torch.no_grad():
        classes = net(x).argmax(dim=1)
    rows: list[Row] = []
    for method in _resnet_methods(net, x, classes, cfg):
        if not ctx.available("captum"):
            method.theirs = None
        ctx.log(f"  {TITLE}: {method.name}, resnet18 {cfg.size}x{cfg.size}, batch {cfg.batch}")
        rows += _time_method(ctx, "resnet18", net, x, method)
    rows += _deepliftshap(ctx, "small CNN", small_cnn().to(ctx.device), 64, cfg.batch, 3, ", no max-pooling")
    if ctx.full:
        rows += _deepliftshap(
            ctx, "vgg11", build_model("vgg11", ctx.device), 64, cfg.batch, 3,
            "; captum's max-pooling rule loses the summation (docstring)",
        )
    return rows
