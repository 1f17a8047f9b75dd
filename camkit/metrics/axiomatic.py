"""Axioms an attribution may satisfy: completeness, non-sensitivity, input invariance."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._perturb import Perturb, as_features, check_count, run_plan, step_indices, step_masks, stepwise
from .deletion import Baseline, _resolve_baseline

__all__ = ["completeness", "input_invariance", "non_sensitivity"]


def completeness(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    baseline: Baseline = 0.0,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
) -> Tensor:
    """Completeness (Sundararajan et al. 2017): how far the attributions' sum is from the score's change.

    ``sum_i a_i - (f(x) - f(x̄))`` per sample, with ``x̄`` the baseline input; 0 for a complete
    attribution (integrated gradients from that baseline, up to its integration error). The
    sum runs over the map as given (a map without channels is summed once). Cost: ``2B``
    forward passes.

    Args:
        model, x, maps, target, baseline, softmax, chunk_size, output, keep_mode: as
            :func:`pixel_flipping`.

    Returns:
        The signed gap [B] (float64).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import completeness
        >>> class Weighted(nn.Module):
        ...     def forward(self, x):
        ...         return (x[:, 0] * torch.tensor([1.0, -2.0, 3.0])).sum(dim=1, keepdim=True)
        >>> x = torch.tensor([[[1.0, 1.0, 2.0]]])
        >>> completeness(Weighted(), x, x[:, 0] * torch.tensor([1.0, -2.0, 3.0]))  # input times gradient
        tensor([0.], dtype=torch.float64)
        >>> completeness(Weighted(), x, torch.ones(1, 3))
        tensor([-2.], dtype=torch.float64)
    """
    features = as_features(maps, x)
    canvas = _resolve_baseline(baseline, x)
    clean, scores = run_plan(
        model, x, target, lambda owner, index: canvas[owner], 1, softmax=softmax, chunk_size=chunk_size,
        output=output, keep_mode=keep_mode,
    )  # fmt: skip
    assert clean is not None
    return features.values.double().sum(dim=1) - (clean.double() - scores[:, 0].double())


def non_sensitivity(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    eps: float = 1e-5,
    features_in_step: int = 1,
    baseline: Baseline = 0.0,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    perturb: Perturb | None = None,
) -> Tensor:
    """Non-sensitivity (Nguyen and Martinez 2020): features where the map and the model disagree about mattering.

    Features are replaced by the baseline in groups of ``features_in_step``, in index order,
    one group at a time. A feature is *unused* by the model when replacing its group changes
    the score by less than ``eps``, and *unattributed* when ``|a_i| < eps``; the result counts
    the features that are one and not the other. 0 is best. Cost:
    ``B * ceil(F / features_in_step) + B`` forward passes.

    Args:
        model, x, maps, target, features_in_step, baseline, softmax, chunk_size, output, keep_mode: as :func:`pixel_flipping`.
        eps: the threshold for both "unused" and "unattributed".
        perturb: instead of ``baseline``, the caller's perturbation (as
            :func:`~camkit.metrics.pixel_flipping`'s), called once per group on ``x``, in index order.

    Returns:
        Long tensor [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import non_sensitivity
        >>> class FirstTwo(nn.Module):  # ignores the last two positions
        ...     def forward(self, x):
        ...         return x[:, 0, :2].sum(dim=1, keepdim=True)
        >>> x = torch.ones(1, 1, 4)
        >>> non_sensitivity(FirstTwo(), x, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
        tensor([0])
        >>> non_sensitivity(FirstTwo(), x, torch.tensor([[1.0, 0.0, 1.0, 0.0]]))  # positions 1 and 2 wrong
        tensor([2])
    """
    features = as_features(maps, x)
    step = check_count(features_in_step, "features_in_step")
    if not eps >= 0:
        raise InvalidInputError(f"eps must be a threshold >= 0, got {eps!r}")
    count = -(-features.count // step)
    canvas = _resolve_baseline(baseline, x)
    index_order = torch.arange(features.count, device=x.device)

    def build(owner: Tensor, index: Tensor) -> Tensor:
        chosen = features.mask(step_masks(index_order.expand(owner.shape[0], -1), index, step, cumulative=False))
        return torch.where(chosen, canvas[owner], x[owner])

    steps = None if perturb is None else stepwise(perturb, x, step_indices(features, step, descending=None), cumulative=False)
    clean, scores = run_plan(
        model, x, target, build, count, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode,
        steps=steps,
    )  # fmt: skip
    assert clean is not None
    unused = ((scores - clean[:, None]).abs() < eps).repeat_interleave(step, dim=1)[:, : features.count]
    unattributed = features.values.abs() < eps
    return (unused ^ unattributed).sum(dim=1)


class _Shifted(nn.Module):
    """``model(x - shift)``: the network of Kindermans et al. whose first layer absorbs an input shift."""

    def __init__(self, model: nn.Module, shift: float) -> None:
        super().__init__()
        self.module = model  # named as DataParallel names its model: camkit's layer names resolve on it
        self.shift = shift

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x - self.shift)


def input_invariance(
    explain: Callable[[nn.Module, Tensor, Target], Tensor],
    model: nn.Module,
    x: Tensor,
    target: Target = None,
    *,
    shift: float = -1.0,
    atol: float = 1e-4,
    shifted: Tensor | None = None,
) -> Tensor:
    """Input invariance (Kindermans et al. 2019): is the map unchanged when the input is shifted
    and the model compensates?

    The second model computes ``model(x' - shift)`` on the shifted input ``x' = x + shift``, so
    it gives exactly the same outputs (and activations) as the first on ``x``; a method is
    input invariant when ``explain(model2, x', target)`` equals ``explain(model, x, target)``
    within ``atol``. Gradients pass unchanged; input times gradient does not. The second model
    wraps the first (its modules are reached as ``module.<name>``, so camkit explainers resolve the
    first model's layer names on it); neither is modified. Cost:
    two explanations.

    Args:
        explain: ``explain(model, x, target) -> maps``, e.g.
            ``lambda m, x, t: camkit.Saliency(m)(x, t)``.
        model: the model; never modified.
        x: inputs [B, C, *S].
        target: as the explainer takes it.
        shift: the constant added to every input value.
        atol: the largest difference that still counts as equal.
        shifted: the shifted inputs ``x'`` [B, C, *S], when they are not ``x + shift`` (a caller's
            shift of some values only, say); the second model still computes ``model(x' - shift)``.

    Returns:
        Float tensor [B] of 1.0 (invariant) or 0.0.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import input_invariance
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
        >>> def gradient(m, x, t):
        ...     x = x.clone().requires_grad_(True)
        ...     return torch.autograd.grad(m(x)[:, t].sum(), x)[0]
        >>> def input_times_gradient(m, x, t):
        ...     return x * gradient(m, x, t)
        >>> x = torch.rand(2, 1, 4)
        >>> input_invariance(gradient, net, x, 0), input_invariance(input_times_gradient, net, x, 0)
        (tensor([1., 1.]), tensor([0., 0.]))
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    first = explain(model, x, target)
    if shifted is not None and shifted.shape != x.shape:
        raise InvalidInputError(f"shifted inputs {list(shifted.shape)} must have the inputs' shape {list(x.shape)}")
    second = explain(_Shifted(model, shift), x + shift if shifted is None else shifted, target)
    if not isinstance(first, Tensor) or not isinstance(second, Tensor) or first.shape != second.shape:
        raise InvalidInputError("explain must return maps of the same shape for both models")
    close = (first.detach() - second.detach()).abs().flatten(1).amax(dim=1) <= atol
    return close.to(x.dtype)
