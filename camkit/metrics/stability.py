"""Relative stability measures (Agarwal et al. 2022): how much a map moves against how much its input moves.

* :func:`relative_input_stability`: against the change of the input;
* :func:`relative_output_stability`: against the change of the model's output;
* :func:`relative_representation_stability`: against the change of an inner layer's output.

Each re-explains ``N`` perturbed copies of the batch (uniform noise drawn from a
``torch.Generator``, or a plan ``perturbed`` [N, B, C, *S]), ``chunk_size`` inputs at a time;
the model runs in eval mode without gradients. Maps may carry a channel axis [B, K, *S]: the
relative change is taken value by value and its norm over every value. Lower is more stable.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..targets.classes import OutputSelector, Target
from ._common import check_model
from ._perturbed import (
    Explain,
    perturbed_inputs,
    prediction_changed,
    reduce_copies,
    reexplained,
    row_norms,
    uniform_noise,
    unperturbed_maps,
)
from ._reexplain import model_outputs

__all__ = ["relative_input_stability", "relative_output_stability", "relative_representation_stability"]


def _relative(
    explainer: Explain, model: nn.Module, x: Tensor, target: Target, denominator: Callable[[Tensor, Tensor], Tensor],
    *, maps: Tensor | None, samples: int, low: float, high: float, eps: float, perturbed: Tensor | None,
    skip_changed: bool, generator: torch.Generator | None, chunk_size: int, output: OutputSelector,
) -> Tensor:  # fmt: skip
    check_model(model)
    target, maps = unperturbed_maps(explainer, model, x, target, maps, chunk_size, output)
    plan = perturbed_inputs(x, perturbed, samples, uniform_noise(low, high, generator))
    moved = reexplained(explainer, plan, target, chunk_size, maps).double()
    e = maps[None].double()
    top = row_norms((e - moved) / (e + (e == 0) * eps))
    bottom = denominator(x, plan)
    bottom = bottom + (bottom == 0) * eps
    skip = prediction_changed(model, x, plan, chunk_size, output) if skip_changed else None
    return reduce_copies(top / bottom, skip, "max")


def _relative_change(before: Tensor, after: Tensor, eps: float) -> Tensor:
    """||(before - after) / before||_2 per row of [N, B, ...], a zero ``before`` replaced by ``eps``."""
    before = before.double()
    return row_norms((before - after.double()) / (before + (before == 0) * eps))


def relative_input_stability(
    explainer: Explain,
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    *,
    maps: Tensor | None = None,
    samples: int = 200,
    low: float = -0.2,
    high: float = 0.2,
    eps: float = 1e-6,
    perturbed: Tensor | None = None,
    skip_changed: bool = True,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
) -> Tensor:
    """Relative input stability (Agarwal et al. 2022): relative change of the map over relative change of the input.

    ``max_n ||(e - e_n) / e||_2 / ||(x - x_n) / x||_2`` over perturbations that keep
    the predicted class, with ``x_n = x + U(low, high)``; elementwise divisions, zeros of the
    divisor replaced by ``eps``, and so is a zero denominator. Needs the model and re-explanation; costs ``samples``
    explanations and forward passes of the batch.

    Args:
        explainer: called as ``explainer(inputs, target)``, returns maps [B, *S] (or ``.maps``), or
            [B, K, *S] with a channel axis, compared whole.
        model: the model (for the outputs, ``target=None`` and ``skip_changed``).
        x: inputs [B, C, *S].
        target, maps, perturbed, generator, chunk_size, output: see :func:`avg_sensitivity`.
        samples: perturbations N.
        low, high: the uniform noise ``U(low, high)`` added to every value.
        eps: replaces zeros in the denominators (Quantus's ``eps_min``).
        skip_changed: leave out the perturbations that change the top-1 class, as the paper
            asks (NaN where all do).

    Returns:
        Float tensor [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import relative_input_stability
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.ones(1, 1, 4)
        >>> identity = lambda inputs, target: inputs[:, 0]  # e(x) = x: the ratio is 1 for every perturbation
        >>> relative_input_stability(identity, net, x, 0, samples=3, skip_changed=False)
        tensor([1.])
    """
    return _relative(
        explainer, model, x, target, lambda a, b: _relative_change(a[None], b, eps), maps=maps, samples=samples,
        low=low, high=high, eps=eps, perturbed=perturbed, skip_changed=skip_changed, generator=generator,
        chunk_size=chunk_size, output=output,
    )  # fmt: skip


def relative_output_stability(
    explainer: Explain,
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    *,
    maps: Tensor | None = None,
    samples: int = 200,
    low: float = -0.2,
    high: float = 0.2,
    eps: float = 1e-6,
    perturbed: Tensor | None = None,
    skip_changed: bool = True,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
) -> Tensor:
    """Relative output stability (Agarwal et al. 2022): relative change of the map over that of the model's output.

    ``max_n ||(e - e_n) / e||_2 / ||h(x) - h(x_n)||_2`` with ``h`` the model's output
    (the logits), over perturbations ``x_n = x + U(low, high)`` that keep the predicted class.
    The output change is not divided by ``h(x)``: the paper's ROS, and Quantus's. Needs the
    model and re-explanation; costs ``samples`` explanations and forward passes of the batch.

    Args:
        explainer: called as ``explainer(inputs, target)``, returns maps [B, *S] (or ``.maps``), or
            [B, K, *S] with a channel axis, compared whole.
        model: the model (for the outputs, ``target=None`` and ``skip_changed``).
        x: inputs [B, C, *S].
        target, maps, perturbed, generator, chunk_size, output: see :func:`avg_sensitivity`.
        samples: perturbations N.
        low, high: the uniform noise ``U(low, high)`` added to every value.
        eps: replaces zeros in the denominators (Quantus's ``eps_min``).
        skip_changed: leave out the perturbations that change the top-1 class, as the paper
            asks (NaN where all do).

    Returns:
        Float tensor [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import relative_output_stability
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
        >>> relative_output_stability(lambda i, t: i[:, 0], net, torch.rand(2, 1, 4), 0, samples=3).shape
        torch.Size([2])
    """

    def outputs(a: Tensor, b: Tensor) -> Tensor:
        h = model_outputs(model, a, chunk_size, output)
        h_n = model_outputs(model, b.flatten(0, 1), chunk_size, output).view(b.shape[0], *h.shape)
        return row_norms(h[None] - h_n)

    return _relative(
        explainer, model, x, target, outputs, maps=maps, samples=samples, low=low, high=high, eps=eps,
        perturbed=perturbed, skip_changed=skip_changed, generator=generator, chunk_size=chunk_size, output=output,
    )  # fmt: skip


def relative_representation_stability(
    explainer: Explain,
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    *,
    representation: Callable[[Tensor], Tensor],
    maps: Tensor | None = None,
    samples: int = 200,
    low: float = -0.2,
    high: float = 0.2,
    eps: float = 1e-6,
    perturbed: Tensor | None = None,
    skip_changed: bool = True,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
) -> Tensor:
    """Relative representation stability (Agarwal et al. 2022): relative change of the map over
    relative change of an internal representation.

    ``max_n ||(e - e_n) / e||_2 / ||(L(x) - L(x_n)) / L(x)||_2`` with ``L`` the
    ``representation`` function (inputs [M, C, *S] to features [M, ...], e.g. a truncated
    model), over perturbations ``x_n = x + U(low, high)`` that keep the predicted class.
    Needs the model, a representation and re-explanation; costs ``samples`` explanations,
    forward passes and representation passes of the batch.

    Args:
        explainer: called as ``explainer(inputs, target)``, returns maps [B, *S] (or ``.maps``), or
            [B, K, *S] with a channel axis, compared whole.
        model: the model (for the outputs, ``target=None`` and ``skip_changed``).
        x: inputs [B, C, *S].
        target, maps, perturbed, generator, chunk_size, output: see :func:`avg_sensitivity`.
        samples: perturbations N.
        low, high: the uniform noise ``U(low, high)`` added to every value.
        eps: replaces zeros in the denominators (Quantus's ``eps_min``).
        skip_changed: leave out the perturbations that change the top-1 class, as the paper
            asks (NaN where all do).
        representation: ``L(inputs) -> features``, run without gradients in chunks.

    Returns:
        Float tensor [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import relative_representation_stability
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        >>> relative_representation_stability(lambda i, t: i[:, 0], net, torch.rand(2, 1, 4), 0,
        ...                                   representation=net[:2], samples=3).shape
        torch.Size([2])
    """

    def features(a: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.cat(
                [representation(a[i : i + chunk_size]).flatten(1) for i in range(0, a.shape[0], chunk_size)]
            )

    def change(a: Tensor, b: Tensor) -> Tensor:
        r = features(a)
        r_n = features(b.flatten(0, 1)).view(b.shape[0], *r.shape)
        return _relative_change(r[None], r_n, eps)

    return _relative(
        explainer, model, x, target, change, maps=maps, samples=samples, low=low, high=high, eps=eps,
        perturbed=perturbed, skip_changed=skip_changed, generator=generator, chunk_size=chunk_size, output=output,
    )  # fmt: skip
