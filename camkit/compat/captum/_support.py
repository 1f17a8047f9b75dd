"""The few helpers of captum's private modules that its tests call to build inputs and reference values.

Input formatting (tuples, zero baselines, a forward that returns a future) and ``compute_gradients``
(plain autograd: the gradient of the target outputs with respect to the inputs), written here so that
no captum code runs after ``install()``. None of them is an attribution.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._pack import as_tuple, flat_targets, forward_args

__all__ = [
    "_batch_example_iterator",
    "_construct_default_feature_mask",
    "_construct_future_forward",
    "_format_additional_forward_args",
    "_format_input_baseline",
    "_format_tensor_into_tuples",
    "_forward_layer_eval",
    "_get_deep_layer_name",
    "_reshape_and_sum",
    "_set_deep_layer_value",
    "_tensorize_baseline",
    "_zeros",
    "apply_gradient_requirements",
    "approximation_parameters",
    "compute_gradients",
    "undo_gradient_requirements",
]

def _get_deep_layer_name(obj: Any, layer_names: str) -> Any:
    """The attribute at the dotted path ``layer_names`` of ``obj`` (``"layer1.0.conv1"``)."""
    for part in layer_names.split("."):
        obj = getattr(obj, part)
    return obj


def _set_deep_layer_value(obj: Any, layer_names: str, value: Any) -> None:
    """Set the attribute at the dotted path ``layer_names`` of ``obj`` to ``value`` (a submodule, say)."""
    parent, _, last = layer_names.rpartition(".")
    setattr(_get_deep_layer_name(obj, parent) if parent else obj, last, value)


def _zeros(inputs: tuple[Tensor, ...]) -> tuple[Any, ...]:
    """A zero baseline per input (``False`` for a boolean input)."""
    return tuple(False if x.dtype == torch.bool else 0 for x in inputs)


def _format_input_baseline(inputs: Any, baselines: Any) -> tuple[tuple[Tensor, ...], tuple[Any, ...]]:
    """Inputs as a tuple and one baseline per input (zeros, ``False`` for a boolean input, by default)."""
    xs = as_tuple(inputs)
    if baselines is None:
        return xs, _zeros(xs)
    return xs, as_tuple(baselines)


def _construct_default_feature_mask(inputs: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], int]:
    """Every element of each input its own feature, numbered across the inputs, and the feature count."""
    from .attr._engine import default_masks

    return default_masks(inputs)


def _batch_example_iterator(bsz: int, *args: Any) -> Any:
    """Each example's slice of every argument (tensors and lists with ``bsz`` entries sliced, the rest as they are)."""
    for i in range(bsz):
        picked: list[Any] = []
        for arg in args:
            if arg is None:
                picked.append(None)
                continue
            items = arg if isinstance(arg, tuple) else (arg,)
            one = tuple(a[i : i + 1] if isinstance(a, (Tensor, list)) and len(a) == bsz else a for a in items)
            picked.append(one if isinstance(arg, tuple) else one[0])
        yield tuple(picked)


def _format_tensor_into_tuples(inputs: Any) -> Any:
    """``None`` as it is, a tensor as a 1-tuple, a tuple as it is."""
    return None if inputs is None else as_tuple(inputs)


def _format_additional_forward_args(additional: Any) -> Any:
    """``None`` as it is, anything else as a tuple."""
    return None if additional is None else forward_args(additional)


def _tensorize_baseline(inputs: tuple[Tensor, ...], baselines: tuple[Any, ...]) -> tuple[Tensor, ...]:
    """Number baselines as full tensors like the inputs; one-row tensor baselines repeated to the batch."""
    out = []
    for base, x in zip(baselines, inputs):
        if isinstance(base, (int, float)):
            out.append(torch.full_like(x, base))
        elif x.shape[0] > base.shape[0] == 1:
            out.append(base.expand(x.shape[0], *base.shape[1:]).clone())
        else:
            out.append(base)
    return tuple(out)


def _construct_future_forward(forward: Any) -> Any:
    """``forward`` returning a completed ``torch.futures.Future`` of its output."""

    def future_forward(*args: Any, **kwargs: Any) -> Any:
        done: torch.futures.Future[Any] = torch.futures.Future()
        done.set_result(forward(*args, **kwargs))
        return done

    return future_forward


def compute_gradients(forward_fn: Any, inputs: Any, target_ind: Any = None,
                      additional_forward_args: Any = None) -> tuple[Tensor, ...]:
    """Gradients of the target outputs (summed over the batch) with respect to each input.

    Example:
        >>> import torch
        >>> from camkit.compat.captum._support import compute_gradients
        >>> x = torch.tensor([[1.0, 2.0]], requires_grad=True)
        >>> compute_gradients(lambda t: (t * t).sum(dim=1), (x,))[0].tolist()
        [[2.0, 4.0]]
    """
    xs = as_tuple(inputs)
    with torch.enable_grad():
        out = forward_fn(*xs, *forward_args(additional_forward_args))
        rows = out.reshape(out.shape[0], -1) if out.dim() else out.reshape(1, 1)
        shape = tuple(out.shape[1:]) if target_ind is None or isinstance(target_ind, tuple) else (1 << 62,)
        index = flat_targets(target_ind, shape, rows.shape[0]).to(rows.device)
        chosen = rows.gather(1, index[:, None])
        return torch.autograd.grad(chosen.sum(), xs, allow_unused=True)


def apply_gradient_requirements(inputs: tuple[Tensor, ...], warn: bool = True) -> list[bool]:
    """Make every floating-point input require gradients; the flags they had, for :func:`undo_gradient_requirements`."""
    had = [x.requires_grad for x in inputs]
    for x in inputs:
        if x.is_floating_point() and not x.requires_grad:
            x.requires_grad_()
    return had


def undo_gradient_requirements(inputs: tuple[Tensor, ...], grad_required: list[bool]) -> None:
    """Give the inputs back the ``requires_grad`` flags :func:`apply_gradient_requirements` found."""
    for x, had in zip(inputs, grad_required):
        if not had and x.requires_grad and x.is_leaf:
            x.requires_grad_(False)


def _reshape_and_sum(tensor: Tensor, n_steps: int, batch: int, shape: tuple[int, ...]) -> Tensor:
    """Rows laid out step by step ([n_steps * batch, *shape]) summed over the steps: [batch, *shape]."""
    return tensor.reshape(n_steps, batch, *shape).sum(dim=0)


def approximation_parameters(method: str) -> tuple[Any, Any]:
    """``(step_sizes(n), alphas(n))`` of captum's method name, from :func:`camkit.functional.integration_points`.

    The nodes are captum's; the weights are camkit's (for ``"riemann_trapezoid"`` they sum to 1,
    where captum's sum to ``(n - 1) / n``: see docs/migration/captum.md).

    Example:
        >>> from camkit.compat.captum._support import approximation_parameters
        >>> sizes, alphas = approximation_parameters("riemann_middle")
        >>> alphas(4), sizes(4)
        ([0.125, 0.375, 0.625, 0.875], [0.25, 0.25, 0.25, 0.25])
    """
    from ...functional.attribution import integration_points
    from .attr._gradient import RULES

    if method not in RULES:
        raise ValueError(f"unknown integration method {method!r}; one of {sorted(RULES)}")
    rule = RULES[method]

    def alphas(n: int) -> list[float]:
        return [float(a) for a in integration_points(n, rule, dtype=torch.float64)[0]]  # type: ignore[arg-type]

    def step_sizes(n: int) -> list[float]:
        return [float(w) for w in integration_points(n, rule, dtype=torch.float64)[1]]  # type: ignore[arg-type]

    return step_sizes, alphas


def _forward_layer_eval(forward_fn: Any, inputs: Any, layer: Any, additional_forward_args: Any = None,
                        device_ids: Any = None, attribute_to_layer_input: bool = False,
                        grad_enabled: bool = False) -> Any:
    """The outputs (or inputs) of ``layer`` in one forward, as a tuple of tensors; a list of those for a list of layers."""
    from ...hooks import HookScope

    layers = layer if isinstance(layer, list) else [layer]
    seen: dict[int, Any] = {}

    def kept(value: Any) -> Any:  # a copy: a later in-place operation (an in-place ReLU) must not change it
        if isinstance(value, Tensor):
            return value if grad_enabled else value.clone()
        return type(value)(kept(v) for v in value) if isinstance(value, (tuple, list)) else value

    def record(index: int) -> Any:
        def hook(module: Any, args: Any, output: Any = None) -> None:
            seen[index] = kept(args if attribute_to_layer_input else output)
        return hook

    with torch.set_grad_enabled(grad_enabled), HookScope() as scope:
        for i, module in enumerate(layers):
            if attribute_to_layer_input:  # read before the layer runs: an in-place layer overwrites its input
                scope.forward_pre(module, record(i))
            else:
                scope.forward(module, record(i), own_thread=True)
        forward_fn(*as_tuple(inputs), *forward_args(additional_forward_args))
    found = [as_tuple(seen[i]) for i in range(len(layers))]
    return found if isinstance(layer, list) else found[0]
