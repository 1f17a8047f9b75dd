"""``ActivationsAndGradients``: the target layers' outputs and their gradients, hooks on camkit's ``HookScope``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from ...hooks import HookScope

__all__ = ["ActivationsAndGradients"]


class ActivationsAndGradients:
    """Record each target layer's output on a forward and its gradient on the backward that follows.

    ``activations`` (in layer order) and ``gradients`` (in the same order once the backward ran)
    are lists of detached tensors, reset by each call; ``release()`` removes the hooks (also on
    leaving a ``with`` block, which the original lacks).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import ActivationsAndGradients
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 2))
        >>> with ActivationsAndGradients(net, [net[1]], None) as recorder:
        ...     recorder(torch.rand(1, 3, 8, 8))[0, 1].backward()
        ...     [tuple(t.shape) for t in recorder.activations + recorder.gradients]
        [(1, 4, 8, 8), (1, 4, 8, 8)]
    """

    def __init__(
        self,
        model: nn.Module,
        target_layers: Sequence[nn.Module],
        reshape_transform: Callable[[Tensor], Tensor] | None,
        detach: bool = True,
    ) -> None:
        self.model = model
        self.reshape_transform = reshape_transform
        self.detach = detach
        self.activations: list[Tensor] = []
        self.gradients: list[Tensor] = []
        self._grads: dict[int, Tensor] = {}
        self._scope = HookScope()
        for layer in target_layers:
            self._scope.forward(layer, self._save)

    def _keep(self, tensor: Tensor) -> Tensor:
        if self.reshape_transform is not None:
            tensor = self.reshape_transform(tensor)
        return tensor.detach() if self.detach else tensor

    def _save(self, module: nn.Module, args: Any, output: Any) -> None:
        self.activations.append(self._keep(output))
        if isinstance(output, Tensor) and output.requires_grad:
            slot = len(self.activations) - 1

            def store(grad: Tensor) -> None:
                self._grads[slot] = self._keep(grad)
                self.gradients = [g for _, g in sorted(self._grads.items())]

            self._scope.tensor(output, store)

    def __call__(self, x: Tensor) -> Any:
        self.activations, self.gradients, self._grads = [], [], {}
        return self.model(x)

    def release(self) -> None:
        """Remove the hooks and drop what was recorded."""
        self._scope.remove()
        self.activations, self.gradients = [], []

    def __enter__(self) -> ActivationsAndGradients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
