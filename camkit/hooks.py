"""The hook layer: the only place in camkit that registers hooks.

Two pieces:

* :class:`HookScope`, a context manager that registers forward-pre, forward,
  full-backward(-pre) and tensor hooks and removes every one of them when the block
  ends, also when it ends with an exception.
* :class:`LayerCapture`, built on it, which records what target layers returned during
  one forward pass and gives the gradient of a score with respect to those outputs.

How :class:`LayerCapture` keeps Grad-CAM cheap
-------------------------------------------------
With ``gradients=True`` the forward pass starts with autograd *off*. When the first
target layer returns, its output is detached into a fresh leaf that requires grad and
autograd is switched *on* for the rest of the forward. So the only graph ever recorded
is the one between the target layer and the score, no parameter gradient is computed,
and memory stays close to a ``torch.no_grad()`` forward's.

Every captured output is handed on to the rest of the network as a *clone*. A later
in-place op (``ReLU(inplace=True)``, ``out += shortcut``) therefore changes the clone,
never the recorded tensor: what camkit records is the output as it left the layer, and
no "view modified in place" error can arise (there is no ``BackwardHookFunction``).

Modules that run more than once in one forward have every call recorded; ``call``
chooses which one is used (default ``-1``: the last call). The choice is explicit and
documented, never a silent mix of calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ._internal.state import GradModes
from .errors import LayerNotReachedError, OutputSelectionError

__all__ = ["HookScope", "LayerCapture"]


def _in_thread(fn: Callable[..., Any], thread: int) -> Callable[..., Any]:
    def hook(*args: Any) -> Any:
        if threading.get_ident() != thread:
            return None
        return fn(*args)

    return hook


class HookScope:
    """Register hooks that are all removed when the ``with`` block ends.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.hooks import HookScope
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
        >>> shapes = []
        >>> with HookScope() as hooks:
        ...     _ = hooks.forward(net[0], lambda m, i, o: shapes.append(tuple(o.shape)))
        ...     _ = net(torch.zeros(4, 2))
        >>> shapes
        [(4, 3)]
        >>> len(net[0]._forward_hooks)
        0
    """

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._prune_at = 64

    def __enter__(self) -> HookScope:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __len__(self) -> int:
        return len(self._handles)

    def _keep(self, handle: RemovableHandle) -> RemovableHandle:
        self._handles.append(handle)
        return handle

    def forward(
        self,
        module: nn.Module,
        fn: Callable[..., Any],
        *,
        with_kwargs: bool = False,
        prepend: bool = False,
        always_call: bool = False,
        own_thread: bool = False,
    ) -> RemovableHandle:
        """Register ``fn(module, args, output)`` (or ``(module, args, kwargs, output)``).

        With ``own_thread=True`` the hook runs only for forwards in the thread that registered
        it: a per-call capture must not see another thread's forward of the same model
        (two explainers, or two calls of one, running concurrently). Long-lived observers
        (monitors) keep the default, which also sees ``DataParallel``'s replica threads.
        """
        if own_thread:
            fn = _in_thread(fn, threading.get_ident())
        return self._keep(
            module.register_forward_hook(
                fn, with_kwargs=with_kwargs, prepend=prepend, always_call=always_call
            )
        )

    def forward_pre(
        self, module: nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False, prepend: bool = False
    ) -> RemovableHandle:
        """Register ``fn(module, args)`` (or ``(module, args, kwargs)``) run before ``forward``."""
        return self._keep(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs, prepend=prepend))

    def full_backward(self, module: nn.Module, fn: Callable[..., Any], *, prepend: bool = False) -> RemovableHandle:
        """Register ``fn(module, grad_input, grad_output)`` on the module's backward."""
        return self._keep(module.register_full_backward_hook(fn, prepend=prepend))

    def full_backward_pre(
        self, module: nn.Module, fn: Callable[..., Any], *, prepend: bool = False
    ) -> RemovableHandle:
        """Register ``fn(module, grad_output)`` run before the module's backward."""
        return self._keep(module.register_full_backward_pre_hook(fn, prepend=prepend))

    def tensor(self, tensor: Tensor, fn: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """Register ``fn(grad)`` on a tensor that requires grad.

        Handles of tensors that have since been freed are dropped as new ones arrive, so a
        long-lived scope that hooks a fresh tensor on every forward does not grow without bound.
        """
        if len(self._handles) >= self._prune_at:
            self._handles = [h for h in self._handles if h.hooks_dict_ref() is not None]
            self._prune_at = max(64, 2 * len(self._handles))
        return self._keep(tensor.register_hook(fn))

    def remove(self) -> None:
        """Remove every hook registered so far (newest first). Safe to call twice."""
        while self._handles:
            self._handles.pop().remove()


def _first_tensor_error(name: str, output: object) -> OutputSelectionError:
    return OutputSelectionError(
        f"layer '{name}' returned {type(output).__name__}, not a tensor; camkit captures tensor "
        "outputs only. Pick the submodule that produces the tensor you want explained "
        "(see camkit.list_layers(model, x))."
    )


class LayerCapture:
    """Record the outputs of target layers in one forward pass, optionally with gradients.

    Args:
        layers: ``(name, module)`` pairs, as returned by :func:`camkit.layers.resolve_layers`.
        gradients: when True, autograd runs only from the first target layer on, so that
            :meth:`gradients` can differentiate a score with respect to the recorded
            outputs. When False the forward runs under ``torch.no_grad()``.
        call: which call of a module that runs several times in one forward is used
            (``-1``, the default, is the last call; ``0`` the first).

    The capture must be entered before the forward and the score computed inside the
    ``with`` block; leaving it removes the hooks and restores autograd's mode.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.hooks import LayerCapture
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(8, 1))
        >>> with LayerCapture([("0", net[0])]) as cap:
        ...     score = net(torch.ones(1, 1, 2, 2))[:, 0]
        ...     (grad,) = cap.gradients(score)
        >>> cap.activations()[0].shape, grad.shape
        (torch.Size([1, 2, 2, 2]), torch.Size([1, 2, 2, 2]))
    """

    def __init__(self, layers: Sequence[tuple[str, nn.Module]], *, gradients: bool = True, call: int = -1) -> None:
        self.layers = list(layers)
        self.track_gradients = gradients
        self.call = call
        self._records: list[list[Tensor]] = [[] for _ in self.layers]
        self._scope = HookScope()
        # Autograd's mode for the capture: off from entry, on from the first recorded output
        # that needs a graph, each change undone in turn on exit (made on entry).
        self._grad_modes: GradModes | None = None

    def __enter__(self) -> LayerCapture:
        try:
            for index, (name, module) in enumerate(self.layers):
                # First among the layer's forward hooks: those registered before (a NeuronTarget on
                # this layer, the user's own) then see the copy that carries the gradient to ``recorded``.
                self._scope.forward(module, self._make_hook(index, name), own_thread=True, prepend=True)
        except BaseException:
            self._scope.remove()
            raise
        self._grad_modes = GradModes()
        self._grad_modes.enter(False)
        return self

    def __exit__(self, *exc: object) -> None:
        self._scope.remove()
        if self._grad_modes is not None:
            self._grad_modes.close()
            self._grad_modes = None

    def _make_hook(self, index: int, name: str) -> Callable[[nn.Module, Any, Any], Any]:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            if not isinstance(output, Tensor):
                raise _first_tensor_error(name, output)
            if not self.track_gradients:
                self._records[index].append(output.detach().clone())
                return None
            if output.requires_grad:
                recorded = output
            else:
                recorded = output.detach().requires_grad_(True)
                if self._grad_modes is not None:
                    self._grad_modes.enter(True)
            self._records[index].append(recorded)
            # The rest of the network gets a copy: in-place ops after the layer change the
            # copy and autograd tracks them through it; ``recorded`` stays as it was.
            return recorded.clone()

        return hook

    def calls(self, index: int = 0) -> int:
        """How many times layer ``index`` ran in the forward."""
        return len(self._records[index])

    def activations(self) -> list[Tensor]:
        """The selected call's output of each layer, in the order given."""
        chosen = []
        for (name, _), records in zip(self.layers, self._records):
            if not records:
                raise LayerNotReachedError(
                    f"layer '{name}' was not called during the forward pass; choose a layer the "
                    "forward uses (see camkit.list_layers(model, x))."
                )
            try:
                chosen.append(records[self.call])
            except IndexError:
                raise LayerNotReachedError(
                    f"layer '{name}' ran {len(records)} time(s) in the forward; call={self.call} "
                    f"is out of range (use 0..{len(records) - 1} or -1 for the last call)."
                ) from None
        return chosen

    def gradients(self, score: Tensor, *, retain_graph: bool = False, unreached_zero: bool = False) -> list[Tensor]:
        """Gradient of ``score.sum()`` with respect to each selected layer output.

        The score of each sample depends only on that sample (the model runs in eval mode),
        so the gradient of the sum is the per-sample gradient of each sample's score. A layer
        the score's graph does not reach raises :class:`~camkit.errors.LayerNotReachedError`,
        or, with ``unreached_zero=True`` (for a graph narrowed to what the score reads, where
        such a layer's gradient is zero), gets zeros.
        """
        if not self.track_gradients:
            raise RuntimeError("LayerCapture(gradients=False) records no graph; use gradients=True")
        acts = self.activations()
        if not score.requires_grad:
            raise LayerNotReachedError(
                f"the score does not depend on layer(s) {[n for n, _ in self.layers]}: no graph "
                "links them. Choose a layer whose output feeds the model's output."
            )
        grads = torch.autograd.grad(score.sum(), acts, retain_graph=retain_graph, allow_unused=True)
        out = []
        for (name, _), act, grad in zip(self.layers, acts, grads):
            if grad is None and unreached_zero:
                grad = torch.zeros_like(act)
            if grad is None:
                raise LayerNotReachedError(
                    f"the score does not depend on layer '{name}' (call {self.call}); choose a "
                    "layer whose output feeds the model's output."
                )
            out.append(grad if grad.shape == act.shape else grad.expand_as(act))
        return out
