"""Edit gradients with hooks: clip by value or norm, scale or zero, for parameters or activations.

An alternative to editing the training loop: the edits live in a :class:`GradientEditor`
scope and are gone when it ends (or when an edit's own handle is removed).

* ``on="parameters"``: the gradient of each chosen parameter is edited **per tensor and per
  backward pass**, before it is accumulated into ``param.grad`` (and in what
  ``torch.autograd.grad`` returns). ``clip_norm`` therefore bounds each parameter's own
  gradient norm; for one norm over all parameters together, call
  ``torch.nn.utils.clip_grad_norm_`` after ``backward()`` instead.
* ``on="activations"``: the gradient with respect to each chosen module's output is edited
  as it flows back through it, so every earlier layer sees the edited gradient. The norm is
  taken over the whole output tensor (the batch included). The edit is attached in each
  forward pass (legal with later in-place ops such as ``ReLU(inplace=True)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Union

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError, LayerNotFoundError
from ..hooks import HookScope
from ..layers.resolve import resolve_layers
from ._walk import iter_tensors

__all__ = ["GradientEditor"]

EditTarget = Union[str, nn.Module, Tensor, Sequence[Union[str, nn.Module, Tensor]]]


def _clip_value(limit: float) -> Callable[[Tensor], Tensor]:
    return lambda g: g.clamp(-limit, limit)


def _clip_norm(max_norm: float) -> Callable[[Tensor], Tensor]:
    def edit(g: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(g.float() if g.dtype in (torch.float16, torch.bfloat16) else g)
        factor = (max_norm / norm.clamp_min(torch.finfo(norm.dtype).tiny)).clamp(max=1.0)
        return g * factor.to(g.dtype)

    return edit


def _scale(factor: float) -> Callable[[Tensor], Tensor]:
    return lambda g: g * factor


def _zero(g: Tensor) -> Tensor:
    return torch.zeros_like(g)


class GradientEditor:
    """A scope for gradient edits on one model.

    Each edit method registers its hooks at once and returns a :class:`camkit.hooks.HookScope`
    whose ``remove()`` undoes just that edit; leaving the ``with`` block (or :meth:`remove`)
    undoes all of them. Several edits on the same tensor apply in the order they were added.

    Targets are dotted module names, modules, dotted parameter names (``"fc.weight"``) or
    parameters, or a list of them. For ``on="parameters"`` a module means all its parameters
    (submodules included) that require grad.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import GradientEditor
        >>> net = nn.Linear(2, 1)
        >>> with GradientEditor(net) as edit:
        ...     _ = edit.clip_value("weight", 0.5)
        ...     net(torch.full((1, 2), 3.0)).sum().backward()
        >>> net.weight.grad.tolist(), net.bias.grad.tolist()
        ([[0.5, 0.5]], [1.0])
        >>> len(net.weight._backward_hooks or {})
        0
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._edits: list[HookScope] = []

    def __enter__(self) -> GradientEditor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Undo every edit (newest first). Safe to call twice."""
        while self._edits:
            self._edits.pop().remove()

    def clip_value(self, targets: EditTarget, limit: float, *, on: str = "parameters") -> HookScope:
        """Clamp every gradient entry to ``[-limit, limit]``."""
        if not limit > 0:
            raise InvalidInputError(f"limit must be > 0, got {limit}")
        return self._add(targets, on, _clip_value(float(limit)))

    def clip_norm(self, targets: EditTarget, max_norm: float, *, on: str = "parameters") -> HookScope:
        """Rescale each gradient tensor whose L2 norm exceeds ``max_norm`` to norm ``max_norm`` (others unchanged)."""
        if not max_norm > 0:
            raise InvalidInputError(f"max_norm must be > 0, got {max_norm}")
        return self._add(targets, on, _clip_norm(float(max_norm)))

    def scale(self, targets: EditTarget, factor: float, *, on: str = "parameters") -> HookScope:
        """Multiply the gradients by ``factor`` (e.g. a per-layer learning-rate multiplier)."""
        return self._add(targets, on, _scale(float(factor)))

    def zero(self, targets: EditTarget, *, on: str = "parameters") -> HookScope:
        """Replace the gradients by zeros (with ``on="activations"``, earlier layers get no gradient through it)."""
        return self._add(targets, on, _zero)

    # ------------------------------------------------------------------------ internals
    def _add(self, targets: EditTarget, on: str, edit: Callable[[Tensor], Tensor]) -> HookScope:
        if on not in ("parameters", "activations"):
            raise InvalidInputError(f"on must be 'parameters' or 'activations', got {on!r}")
        scope = HookScope()
        try:
            if on == "parameters":
                params = self._parameters(targets)
                for param in params:
                    scope.tensor(param, edit)
            else:
                for _, module in self._modules(targets):
                    scope.forward(module, self._make_forward_hook(scope, edit))
        except BaseException:
            scope.remove()
            raise
        self._edits.append(scope)
        return scope

    @staticmethod
    def _make_forward_hook(scope: HookScope, edit: Callable[[Tensor], Tensor]) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not torch.is_grad_enabled():
                return
            for t in iter_tensors(output):
                if t.requires_grad:
                    scope.tensor(t, edit)

        return hook

    @staticmethod
    def _as_list(targets: EditTarget) -> list[str | nn.Module | Tensor]:
        if isinstance(targets, (str, nn.Module, Tensor)):
            return [targets]
        items = list(targets)
        if not items:
            raise InvalidInputError("targets is empty; give module or parameter names, modules or parameters")
        return items

    def _modules(self, targets: EditTarget) -> list[tuple[str, nn.Module]]:
        items = self._as_list(targets)
        params = dict(self.model.named_parameters())
        for item in items:
            if isinstance(item, Tensor) or (isinstance(item, str) and item in params):
                raise InvalidInputError(
                    f"on='activations' edits the gradient of a module's output; {item if isinstance(item, str) else 'a tensor'} "
                    "is a parameter. Pass a module, or use on='parameters'."
                )
        return resolve_layers(self.model, [i for i in items if not isinstance(i, Tensor)])

    def _parameters(self, targets: EditTarget) -> list[nn.Parameter]:
        named = dict(self.model.named_parameters())
        by_id = {id(p) for p in named.values()}
        chosen: dict[int, nn.Parameter] = {}
        for item in self._as_list(targets):
            explicit = isinstance(item, Tensor) or (isinstance(item, str) and item in named)
            if isinstance(item, Tensor):
                if id(item) not in by_id:
                    raise InvalidInputError("a tensor passed as target is not a parameter of the model")
                found = [item]
            elif isinstance(item, str) and item in named:
                found = [named[item]]
            elif item is self.model or item == "":
                found = list(self.model.parameters())
            else:
                try:
                    ((_, module),) = resolve_layers(self.model, item)
                except LayerNotFoundError as err:
                    raise LayerNotFoundError(f"{err} (parameter names like 'fc.weight' work too)") from None
                found = list(module.parameters())
            for param in found:
                if param.requires_grad:
                    chosen[id(param)] = param  # type: ignore[assignment]
                elif explicit:
                    raise InvalidInputError(
                        f"the target parameter of shape {list(param.shape)} does not require grad, so it has no "
                        "gradient to edit; choose trainable parameters."
                    )
        if not chosen:
            raise InvalidInputError("the targets hold no trainable parameters; did you mean on='activations'?")
        return list(chosen.values())
