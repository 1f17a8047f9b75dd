"""A Quantus perturbation function as the ``perturb`` hook of camkit's native metrics.

Quantus calls a metric's ``perturb_func`` on numpy arrays: ``perturb_func(arr=[B, F],
indices=[B, k])`` once per step for the whole batch, with ``perturb_baseline`` and
``perturb_func_kwargs`` bound (its ``make_perturb_func``). The native metrics call their
``perturb(images, indices)`` hook the same number of times, in the same order, on the same
batches; :class:`NumpyPerturbation` turns one into the other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["NumpyMaskPerturbation", "NumpyPerturbation", "Replayed", "bind_perturb_func"]


def bind_perturb_func(func: Callable[..., Any], perturb_baseline: Any, kwargs: dict[str, Any] | None) -> Callable[..., Any]:
    """Quantus's ``make_perturb_func``: ``func`` with ``perturb_baseline``, ``perturb_func_kwargs`` over it."""
    return functools.partial(func, **{"perturb_baseline": perturb_baseline, **(kwargs or {})})


class NumpyPerturbation:
    """``perturb(images [B, C, *S], indices [B, k]) -> images`` calling ``func(arr=[B, F], indices=[B, k])`` on numpy.

    Args:
        func: the bound Quantus perturbation function.
        maps: with ``descending``, the maps [B, F] the native metric sorted (a stable sort): the
            indices it passes are then renamed to those numpy's ``argsort`` puts at the same
            places, so that features of equal attribution are taken in Quantus's order.
        descending: the sort (True: ``argsort(-a)``, False: ``argsort(a)``); None: pass the indices as they are.
    """

    def __init__(self, func: Callable[..., Any], maps: Tensor | None = None, descending: bool | None = None) -> None:
        self.func = func
        self.rename: tuple[np.ndarray, np.ndarray] | None = None
        if maps is not None and descending is not None:
            values = maps.detach().flatten(1).cpu().numpy()
            values = -values if descending else values
            stable = np.argsort(values, axis=1, kind="stable")
            place = np.empty_like(stable)
            np.put_along_axis(place, stable, np.arange(values.shape[1])[None].repeat(values.shape[0], 0), axis=1)
            self.rename = (np.argsort(values, axis=1), place)  # numpy's own order, as Quantus sorts

    def __call__(self, images: Tensor, indices: Tensor) -> Tensor:
        arr = images.detach().cpu().numpy().reshape(images.shape[0], -1).copy()
        idx = indices.detach().cpu().numpy()
        if self.rename is not None:
            quantus_order, place = self.rename
            idx = np.take_along_axis(quantus_order, np.take_along_axis(place, idx, axis=1), axis=1)
        out = np.asarray(self.func(arr=arr, indices=idx))
        return torch.as_tensor(out.reshape(images.shape), dtype=images.dtype, device=images.device)


class NumpyMaskPerturbation:
    """``perturb(images [B, C, *S], mask [B, 1, *S]) -> images`` calling ``func(arr=images, mask=mask)`` on numpy
    (Quantus's ``IROF`` calls its perturbation so: the whole batch, unflattened, with a bool mask)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func

    def __call__(self, images: Tensor, mask: Tensor) -> Tensor:
        out = np.asarray(self.func(arr=images.detach().cpu().numpy().copy(), mask=mask.detach().cpu().numpy()))
        return torch.as_tensor(out.reshape(images.shape), dtype=images.dtype, device=images.device)


class Replayed:
    """A perturbation whose ``k``-th call starts from numpy's generator state ``states[k]``.

    For a metric that draws everything before the model runs where Quantus alternates its own
    draws and the function's: the states are taken where Quantus calls the function, and after
    the last call the generator is left where it was when this call began (after all the draws).
    """

    def __init__(self, perturb: Callable[[Tensor, Tensor], Tensor], states: list[Any]) -> None:
        self.perturb, self.states, self.calls = perturb, states, 0
        self.end = np.random.get_state()

    def __call__(self, images: Tensor, indices: Tensor) -> Tensor:
        np.random.set_state(self.states[self.calls])
        self.calls += 1
        try:
            return self.perturb(images, indices)
        finally:
            np.random.set_state(self.end)
