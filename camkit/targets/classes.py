"""Targets: which score of the model's output an explanation is about.

A target is one of:

* ``None``: the top-1 class of each sample;
* an ``int``: the same class for every sample;
* a sequence or 1-D integer tensor of length B: one class per sample;
* a 2-D integer tensor [B, K]: K classes per sample, explained from one forward pass;
* a callable ``f(output) -> Tensor[B]`` (or [B, K]) returning any differentiable score.

Class indices given on the CPU (ints, lists, CPU tensors) are checked before anything
runs; a length mismatch or out-of-range class raises :class:`InvalidTargetError`, never a
silent zero map.

Class indices given as a tensor on a device (a GPU) are range-checked *on the device*:
reading them back to raise would stall the device on every call. An out-of-range class
there is clamped into range for the lookup and its score is NaN, so
``explanation.scores.isnan()`` marks the samples whose target was invalid (gradient
methods give them a zero, ``flat`` map, as no gradient flows from a NaN score). To have
the error raised up front, pass the classes as a list or a CPU tensor (checked for free).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor

from .._internal import syncs as _syncs
from ..errors import InvalidTargetError, OutputSelectionError

__all__ = ["OutputSelector", "Target", "check_class_range", "given_classes", "resolve_target", "select_output"]

Target = Union[None, int, Sequence[int], Tensor, Callable[[Tensor], Tensor]]
OutputSelector = Union[None, int, str, Callable[[Any], Tensor]]


def _describe(output: Any) -> str:
    if isinstance(output, Tensor):
        return f"Tensor{list(output.shape)}"
    if isinstance(output, dict):
        return f"{type(output).__name__} with keys " + ", ".join(f"{k!r}: {_describe(v)}" for k, v in output.items())
    if isinstance(output, (tuple, list)):
        return f"{type(output).__name__} of " + ", ".join(_describe(v) for v in output)
    fields = [k for k in dir(output) if not k.startswith("_") and isinstance(getattr(output, k, None), Tensor)]
    return f"{type(output).__name__} with tensor attributes {fields}" if fields else type(output).__name__


def _suggest(output: Any) -> str:
    if isinstance(output, dict):
        keys = [k for k, v in output.items() if isinstance(v, Tensor)]
        if keys:
            return f" (here: output={keys[0]!r})"
    elif isinstance(output, (tuple, list)):
        first = [i for i, v in enumerate(output) if isinstance(v, Tensor)]
        if first:
            return f" (here: output={first[0]})"
        if output and all(isinstance(v, dict) for v in output):
            return "; for a list of per-image detections use target=camkit.DetectionTarget(...)"
    elif isinstance(getattr(output, "logits", None), Tensor):
        return " (here: output='logits')"
    return ""


def _default_logits(output: Any) -> Any:
    # A dict, or a transformers ModelOutput (an OrderedDict subclass), with a logits tensor:
    # classifiers' scores. Anything else is returned as it is (and refused if not a tensor).
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        return output["logits"]
    return output


def select_output(output: Any, selector: OutputSelector = None) -> Tensor:
    """Pick the tensor to score from what the model returned.

    Args:
        output: the model's return value.
        selector: ``None`` (the output must be a tensor, or a dict / Hugging Face
            ``ModelOutput`` with a ``logits`` tensor, which is then used), a tuple/list index (also on
            outputs with ``to_tuple()``, like HuggingFace's), a dict key or attribute name
            (``"out"``, ``"logits"``), or a callable ``f(output) -> Tensor``.

    Example:
        >>> import torch
        >>> from camkit.targets import select_output
        >>> select_output({"logits": torch.ones(2, 3)}, "logits").shape
        torch.Size([2, 3])
        >>> select_output({"logits": torch.ones(2, 3), "hidden_states": None}).shape  # logits by default
        torch.Size([2, 3])
    """
    try:
        if selector is None:
            chosen = _default_logits(output)
        elif callable(selector):
            chosen = selector(output)
        elif isinstance(selector, bool):
            raise LookupError(selector)
        elif isinstance(selector, int) and isinstance(output, (tuple, list)):
            chosen = output[selector]
        elif isinstance(selector, int) and callable(getattr(output, "to_tuple", None)):
            chosen = output.to_tuple()[selector]
        elif isinstance(selector, str) and isinstance(output, dict):
            chosen = output[selector]
        elif isinstance(selector, str):
            chosen = getattr(output, selector)
        else:
            raise LookupError(selector)
    except (LookupError, AttributeError):
        raise OutputSelectionError(
            f"output={selector!r} does not select anything from the model's output "
            f"({_describe(output)})."
        ) from None
    if not isinstance(chosen, Tensor):
        what = "the model returned" if selector is None else f"output={selector!r} selected"
        raise OutputSelectionError(
            f"{what} {_describe(chosen)}, not a tensor; pass output= to choose what to "
            f"explain: a tuple index, a dict key or attribute name, or a callable{_suggest(chosen)}."
        )
    return chosen


def _class_count(logits: Tensor) -> int:
    if logits.dim() != 2:
        raise InvalidTargetError(
            f"class targets need [B, num_classes] scores, but the output has shape {list(logits.shape)}; "
            "pass target= a callable f(output) -> Tensor[B] for other outputs."
        )
    return logits.shape[1]


def _check_classes(index: Tensor, classes: int) -> Tensor | None:
    """Range-check class indices: eagerly where reading them is free, else on the device.

    Returns ``None`` when the indices were checked on the host (an out-of-range class
    raises), or a bool validity [B] / [B, K] computed on the device without a sync.
    """
    if index.numel() == 0:
        return None
    if _syncs.reads_are_free(index):
        check_class_range(index, classes)
        return None
    return (index >= 0) & (index < classes)


def check_class_range(index: Tensor, classes: int) -> None:
    """Raise :class:`~camkit.errors.InvalidTargetError` for a class index outside ``[0, classes)``; reads ``index`` on the host.

    Example:
        >>> import torch
        >>> from camkit.targets.classes import check_class_range
        >>> check_class_range(torch.tensor([0, 3]), classes=4)
        >>> check_class_range(torch.tensor([0, 4]), classes=4)
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidTargetError: target class 4 is out of range for an output with 4 classes
    """
    values = (index if index.dim() == 1 else index.flatten()).tolist()  # one read of the host's memory, no reduction
    if not values:
        return
    low, high = min(values), max(values)
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        raise InvalidTargetError(f"target class {bad} is out of range for an output with {classes} classes")


def _plain_target(target: Any) -> Any:
    """Numpy integers as ints; bools, strings, floats and other objects refused with what to pass."""
    if target is None or isinstance(target, Tensor):  # the usual targets, first: the checks below are slower
        return target
    if isinstance(target, (bool, np.bool_)):
        raise InvalidTargetError("target must be a class index, not a bool")
    if isinstance(target, numbers.Integral):
        return int(target)
    if isinstance(target, np.ndarray):
        return torch.from_numpy(target)
    if isinstance(target, str):
        raise InvalidTargetError(
            f"target={target!r} is a string; camkit needs class indices. Map the name to its index first "
            "(e.g. weights.meta['categories'].index(name) for torchvision weights, "
            "model.config.label2id[name] for Hugging Face models)."
        )
    if isinstance(target, numbers.Real):
        raise InvalidTargetError(f"target={target!r} is not an integer class index")
    if isinstance(target, (list, tuple)):
        return target
    raise InvalidTargetError(
        f"target must be None, an int, a sequence of ints, an integer tensor [B] or [B, K], or a callable "
        f"f(output) -> Tensor[B]; got {type(target).__name__}"
    )


def _index_tensor(target: Any, batch: int) -> Tensor:
    """A sequence or tensor target (after :func:`_plain_target`) as its class indices [B] or [B, K], range unchecked.

    Raises:
        InvalidTargetError: a dtype that is not an integer's, or a shape that is not [B] or [B, K].
    """
    index = torch.as_tensor(target)
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise InvalidTargetError(f"target classes must be integers, got dtype {index.dtype}")
    if index.dim() not in (1, 2) or index.shape[0] != batch:
        raise InvalidTargetError(
            f"target has shape {list(index.shape)} but the batch has {batch} samples; give one class "
            "per sample ([B]), K classes per sample ([B, K]), or a single int for all."
        )
    return index


def given_classes(target: Target, batch: int) -> Tensor | None:
    """The classes a target names before any forward, [B] or [B, K] (range checked later); ``None`` if it names none.

    ``None`` for the predicted class (``target=None``), a callable, or anything :func:`resolve_target`
    would refuse (it then refuses it on the other path, with its message). Numpy integers and arrays
    count as the ints and tensors they hold, as :func:`resolve_target` reads them.

    Example:
        >>> from camkit.targets.classes import given_classes
        >>> given_classes(3, batch=2).tolist(), given_classes([[1, 2], [0, 4]], batch=2).shape
        ([3, 3], torch.Size([2, 2]))
        >>> given_classes(None, batch=2) is None, given_classes("cat", batch=2) is None
        (True, True)
    """
    if target is None or callable(target):
        return None
    try:
        target = _plain_target(target)
        if isinstance(target, int):
            return torch.full((batch,), target, dtype=torch.long)
        return _index_tensor(target, batch).long()
    except (InvalidTargetError, TypeError, ValueError, RuntimeError):  # the last three: what torch.as_tensor refuses
        return None


def resolve_target(target: Target, output: Any, batch: int | None = None) -> tuple[Tensor | None, Tensor]:
    """Compute the scores an explanation differentiates.

    Args:
        target: see the module docstring.
        output: the selected model output, [B, num_classes] for class targets. A callable
            target may receive any output (e.g. a list of per-image detections).
        batch: the number of images, B; by default ``output.shape[0]``.

    Returns:
        ``(classes, scores)``: ``classes`` is a LongTensor [B] or [B, K] on the output's
        device (``None`` for a callable target) and ``scores`` the matching scores [B] or
        [B, K], still attached to the autograd graph.

    Example:
        >>> import torch
        >>> from camkit.targets import resolve_target
        >>> classes, scores = resolve_target(None, torch.tensor([[0.1, 0.9], [2.0, 1.0]]))
        >>> classes.tolist(), scores.tolist()
        ([1, 0], [0.8999999761581421, 2.0])
    """
    if batch is None:
        if not isinstance(output, Tensor):
            raise OutputSelectionError(
                f"cannot score {_describe(output)}: class targets need a tensor; pass output= or a callable target"
            )
        batch = output.shape[0]
    if callable(target) and not isinstance(target, Tensor):
        scores = target(output)
        if not isinstance(scores, Tensor) or scores.dim() not in (1, 2) or scores.shape[0] != batch:
            got = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise InvalidTargetError(f"a callable target must return a tensor [B] or [B, K] with B={batch}, got {got}")
        return None, scores
    if not isinstance(output, Tensor):
        raise OutputSelectionError(
            f"class targets need a tensor output, got {_describe(output)}; pass output= to select one"
            f"{_suggest(output)} or a callable target."
        )
    classes = _class_count(output)
    target = _plain_target(target)
    if target is None:
        index = output.detach().argmax(dim=1)
    elif isinstance(target, int):
        if not 0 <= target < classes:
            raise InvalidTargetError(f"target class {target} is out of range for an output with {classes} classes")
        index = torch.full((batch,), target, dtype=torch.long, device=output.device)
    else:
        index = _index_tensor(target, batch)
        valid = _check_classes(index, classes)
        if index.device != output.device or index.dtype != torch.long:
            index = index.to(device=output.device, dtype=torch.long, non_blocking=True)
        if valid is not None:
            # A device tensor is not read back for a check (that would stall the device):
            # out-of-range classes are clamped for the gather and their scores set to NaN.
            index = index.clamp(0, classes - 1)
            scores = output.gather(1, index if index.dim() == 2 else index[:, None])
            scores = torch.where(valid.to(output.device).view(scores.shape), scores, torch.nan)
            return index, scores if index.dim() == 2 else scores.view(-1)
    scores = output.gather(1, index if index.dim() == 2 else index[:, None])
    return index, scores if index.dim() == 2 else scores.view(-1)
