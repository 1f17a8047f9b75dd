"""captum's contract for perturbation methods: forward evaluations, targets, feature masks, progress.

captum's perturbation methods call the forward function on perturbed copies of the inputs laid
side by side (``perturbations_per_eval`` copies per call), select the target from each output the
way captum's ``_select_targets`` does, and accept outputs that do not grow with the batch (a
scalar or a fixed-size tensor for the whole batch: the "aggregated" mode, where every example is
perturbed at once). These helpers hold that contract once, for the translated classes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._pack import CaptumInputError, CaptumTargetError, as_tuple, forward_args
from ._base import PerturbationAttribution

__all__ = [
    "Perturbation",
    "Progress",
    "default_masks",
    "expand_args",
    "expand_target",
    "format_baselines",
    "format_masks",
    "select_targets",
]


def as_output(out: Any) -> Tensor:
    """A forward function's result as a tensor: ints as int64, floats as float64 (as captum does)."""
    if isinstance(out, Tensor):
        return out
    if isinstance(out, bool) or not isinstance(out, (int, float)):
        raise CaptumTargetError(f"the forward function must return a tensor, an int or a float, got {type(out).__name__}")
    return torch.tensor(out, dtype=torch.int64 if isinstance(out, int) else torch.float64)


def select_targets(output: Tensor, target: Any) -> Tensor:
    """captum's target selection on an output [B, ...]: an index of the last axes, or one per example."""
    if target is None:
        return output
    if isinstance(target, Tensor) and target.numel() == 1 and not target.is_floating_point():
        target = int(target.item())
    if isinstance(target, (int, tuple)):
        index = target if isinstance(target, tuple) else (target,)
        if len(index) > output.dim() - 1:
            raise CaptumTargetError(f"target {target!r} has more indices than the output {list(output.shape)} has axes after the batch")
        return output[(slice(None), *index)]
    rows = output.shape[0] if output.dim() else 0
    if isinstance(target, Tensor):
        if target.dim() != 1 or target.numel() != rows or output.dim() != 2:
            raise CaptumTargetError(f"a tensor target {list(target.shape)} for an output {list(output.shape)}")
        return output.gather(1, target.reshape(rows, 1).to(output.device)).squeeze(-1)
    if isinstance(target, list):
        if len(target) != rows:
            raise CaptumTargetError(f"{len(target)} targets for an output of {rows} rows")
        if isinstance(target[0], tuple):
            return torch.stack([output[(i, *t)] for i, t in enumerate(target)])
        if output.dim() != 2:
            raise CaptumTargetError(f"a list of class targets needs an output [B, K], got {list(output.shape)}")
        return output.gather(1, torch.tensor(target, device=output.device).reshape(rows, 1)).squeeze(-1)
    raise CaptumTargetError(f"target of type {type(target).__name__} is not valid")


def expand_target(target: Any, copies: int) -> Any:
    """A per-example target repeated for ``copies`` perturbed copies of the batch laid one after another."""
    if isinstance(target, list):
        return target * copies
    if isinstance(target, Tensor) and target.numel() > 1:
        return torch.cat([target] * copies)
    return target


def expand_args(extra: tuple[Any, ...], copies: int) -> tuple[Any, ...]:
    """The additional forward arguments repeated like the inputs (tensors with a batch axis only)."""
    return tuple(torch.cat([a] * copies) if isinstance(a, Tensor) and a.dim() > 0 else a for a in extra)


def default_masks(xs: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], int]:
    """Every element of each input its own feature [1, *shape], numbered across the inputs, and their count."""
    masks, start = [], 0
    for x in xs:
        count = x[0:1].numel()
        masks.append(start + torch.arange(count, device=x.device).reshape(x[0:1].shape))
        start += count
    return tuple(masks), start


def format_masks(feature_mask: Any, xs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """captum's feature masks: one per input, or by default every element its own id, numbered across inputs."""
    if feature_mask is None:
        return default_masks(xs)[0]
    masks: tuple[Tensor, ...] = as_tuple(feature_mask)
    if len(masks) != len(xs):
        raise CaptumInputError(f"{len(masks)} feature masks for {len(xs)} inputs; give one per input")
    out = []
    for i, (m, x) in enumerate(zip(masks, xs)):
        if m.dim() < x.dim():
            m = m.reshape((1,) * (x.dim() - m.dim()) + tuple(m.shape))
        try:
            torch.broadcast_shapes(m.shape, x.shape)
        except RuntimeError as error:
            raise CaptumInputError(f"feature mask {i} of shape {list(m.shape)} does not broadcast to its input {list(x.shape)}") from error
        out.append(m.to(x.device))
    return tuple(out)


def format_baselines(baselines: Any, xs: tuple[Tensor, ...]) -> tuple[Any, ...]:
    """One baseline per input: a number (``0``, or ``False`` for a boolean input, by default) or a tensor."""
    if baselines is None:
        return tuple(False if x.dtype == torch.bool else 0 for x in xs)
    items = baselines if isinstance(baselines, tuple) else (baselines,)
    if len(items) != len(xs):
        raise CaptumInputError(f"{len(items)} baselines for {len(xs)} inputs; give one per input")
    for base, x in zip(items, xs):
        if isinstance(base, Tensor):
            try:
                torch.broadcast_shapes(base.shape, x.shape)
            except RuntimeError as error:
                raise CaptumInputError(f"baseline {list(base.shape)} does not broadcast to the input {list(x.shape)}") from error
            if base.dim() == x.dim() and base.shape[0] not in (1, x.shape[0]):
                raise CaptumInputError(f"baseline {list(base.shape)}: one row, or one per example ({x.shape[0]})")
        elif not isinstance(base, (int, float, bool)):
            raise CaptumInputError(f"baselines must be numbers or tensors, got {type(base).__name__}")
    return tuple(base.detach() if isinstance(base, Tensor) else base for base in items)


class Progress:
    """A progress line on stderr (``"<name> attribution: 40% 2/5"``), as captum's ``show_progress`` prints."""

    def __init__(self, name: str, total: int, enabled: bool) -> None:
        self.name, self.total, self.enabled, self.done = name, max(1, total), enabled, 0
        self.update(0)

    def update(self, count: int = 1) -> None:
        self.done += count
        if self.enabled:
            percent = min(100, int(100 * self.done / self.total))
            sys.stderr.write(f"\r{self.name} attribution: {percent}% {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


class Perturbation(PerturbationAttribution):
    """Base of the translated perturbation methods: evaluates the forward function as captum does.

    ``attribute_future`` runs ``attribute`` with a forward function that must return futures (each
    waited on) and returns the attribution as a completed future; ``attribute`` refuses a forward
    function that returns one, as captum does.
    """

    _futures = False

    def evaluate(self, inputs: tuple[Tensor, ...], target: Any, extra: tuple[Any, ...]) -> Tensor:
        """The forward function on ``inputs`` with the target selected (a tensor, any shape)."""
        out = self.forward_func(*inputs, *extra)
        if isinstance(out, torch.futures.Future):
            if not self._futures:
                raise CaptumInputError("the forward function returned a Future: call attribute_future instead of attribute")
            out = out.wait()
        elif self._futures:
            raise CaptumInputError("attribute_future needs a forward function that returns a torch.futures.Future")
        return select_targets(as_output(out), target)

    def attribute_future(self, *args: Any, **kwargs: Any) -> torch.futures.Future[Any]:
        self._futures = True
        try:
            result = self.attribute(*args, **kwargs)
        finally:
            self._futures = False
        done: torch.futures.Future[Any] = torch.futures.Future()
        done.set_result(result)
        return done.then(lambda future: future.value())  # torch's own type (torch.Future), as captum's chained futures

    @classmethod
    def get_name(cls) -> str:
        """The class name in words (``"Feature Ablation"``), as captum's progress line shows it."""
        name = cls.__name__
        return "".join(" " + c if c.isupper() and i and not name[i - 1].isupper() else c for i, c in enumerate(name))


def prepare(inputs: Any, baselines: Any, extra: Any, feature_mask: Any,
            ) -> tuple[tuple[Tensor, ...], tuple[Any, ...], tuple[Any, ...], tuple[Tensor, ...]]:
    """captum's inputs, baselines, additional arguments and feature masks, each as a tuple."""
    xs = tuple(x.detach() for x in as_tuple(inputs))
    if not xs or not all(isinstance(x, Tensor) for x in xs):
        raise CaptumInputError("inputs must be a tensor or a tuple of tensors")
    return xs, format_baselines(baselines, xs), forward_args(extra), format_masks(feature_mask, xs)


Replace = Callable[[Tensor, Any, Tensor], Tensor]


def replaced(x: Tensor, base: Any, mask: Tensor) -> Tensor:
    """``x`` with the baseline where ``mask`` is 1 (captum's arithmetic: also for integer and boolean inputs)."""
    return x * (1 - mask.long()).to(x.dtype) + base * mask.to(x.dtype)
