"""captum's attribution base classes, and the one driver every translated ``attribute`` goes through.

:meth:`Attribution._run` packs the call's inputs (see :mod:`camkit.compat.captum._pack`), builds
the camkit explainer the subclass names for the packed model, explains, and unpacks camkit's
``raw`` attribution into captum's shapes and dtypes. Extra tensor arguments with one row per
example, and methods whose settings depend on the example, run one example at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ....errors import CamkitError, InvalidTargetError
from ....explanation import Explanation
from ....methods import Explainer
from ....targets import NeuronTarget
from .._pack import (
    CaptumTargetError,
    Layout,
    Packed,
    anchored,
    as_tuple,
    baselines_like,
    example_args,
    flat_targets,
    forward_args,
    per_example,
)

__all__ = [
    "Attribution",
    "GradientAttribution",
    "InternalAttribution",
    "LayerAttribution",
    "NeuronAttribution",
    "NotComputedError",
    "PerturbationAttribution",
    "has_tuple",
    "raw_of",
]

Build = Callable[[nn.Module, Layout, Tensor, int], Explainer]


class NotComputedError(CamkitError, NotImplementedError):
    """What captum computes and camkit does not: the call is refused rather than answered differently."""


class Attribution:
    """captum's ``Attribution``: ``attribute(inputs, ...)`` on a forward function."""

    #: the explainer takes the gradient of one forward call on exactly the batch, so a model that returns
    #: one value for the whole batch is attributed as captum does (see :class:`~camkit.compat.captum._pack.Packed`)
    _whole_batch = False

    def __init__(self, forward_func: Callable[..., Any]) -> None:
        self.forward_func = forward_func

    def attribute(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.attribute")

    def attribute_future(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("attribute_future is not implemented (neither is it in captum for this method)")

    def has_convergence_delta(self) -> bool:
        return False

    #: captum's ``multiply_by_inputs``: whether the attribution is the global form (times the input's change)
    _multiply: bool = False

    @property
    def multiplies_by_inputs(self) -> bool:
        return self._multiply

    def compute_convergence_delta(self, attributions: Any, start_point: Any, end_point: Any, target: Any = None,
                                  additional_forward_args: Any = None) -> Tensor:
        """``sum(attributions) - (f(end_point) - f(start_point))`` per example (captum's check of completeness)."""
        ends = as_tuple(end_point)
        starts = baselines_like(start_point, ends) if not isinstance(start_point, tuple) or any(
            not isinstance(s, Tensor) for s in start_point) else tuple(s.expand_as(e) for s, e in zip(start_point, ends))
        extra = forward_args(additional_forward_args)
        index = self._target_index(ends, target, extra)
        with torch.no_grad():
            scores = [self.forward_func(*p, *extra).reshape(ends[0].shape[0], -1).gather(1, index[:, None])[:, 0]
                      for p in (ends, starts)]
        total = sum(a.reshape(a.shape[0], -1).sum(dim=1) for a in as_tuple(attributions))
        return total - (scores[0] - scores[1]).to(total.dtype)

    def _target_index(self, xs: tuple[Tensor, ...], target: Any, extra: tuple[Any, ...]) -> Tensor:
        row: tuple[int, ...] = ()
        needs_row = target is None or has_tuple(target)
        if needs_row:  # the output's row shape, from one example
            with torch.no_grad():
                out = self.forward_func(*(x[:1] for x in xs), *example_args(extra, xs[0].shape[0], 0))
            row = tuple(out.shape[1:]) if isinstance(out, Tensor) and out.dim() > 0 else ()
        elif isinstance(target, (int, Tensor, list)):
            row = (1 << 62,)  # plain class indices: any row length
        return flat_targets(target, row, xs[0].shape[0])

    def _run(
        self,
        inputs: Any,
        target: Any,
        additional_forward_args: Any,
        build: Build,
        *,
        one_by_one: bool = False,
        unpack: bool = True,
    ) -> tuple[Any, list[Explanation]]:
        """:meth:`_explained`, with camkit's target errors raised as captum raises them (``AssertionError`` too)."""
        try:
            return self._explained(inputs, target, additional_forward_args, build, one_by_one=one_by_one, unpack=unpack)
        except InvalidTargetError as error:
            if isinstance(error, AssertionError):
                raise
            raise CaptumTargetError(str(error)) from error

    def _explained(
        self,
        inputs: Any,
        target: Any,
        additional_forward_args: Any,
        build: Build,
        *,
        one_by_one: bool = False,
        unpack: bool = True,
    ) -> tuple[Any, list[Explanation]]:
        """Explain ``inputs`` with the explainer ``build(packed_model, layout, x, batch)`` makes.

        Returns:
            ``(raw, explanations)``: raw as captum returns it (a tensor, or a tuple for tuple
            inputs; with ``unpack=False`` camkit's raw as it is) and camkit's explanations (one,
            or one per example).
        """
        xs = as_tuple(inputs)
        layout = getattr(self, "_layout_override", None) or Layout.of(xs)
        extra = forward_args(additional_forward_args)
        batch = xs[0].shape[0]
        neuron = isinstance(target, NeuronTarget)
        index = target if neuron else self._target_index(xs, target, extra)
        packed = layout.pack(xs)
        dtypes = tuple(x.dtype for x in xs)
        explanations = []
        wrap = getattr(self, "_wrap", None)  # NoiseTunnel's: camkit's SmoothGrad around the explainer
        if wrap is not None:
            build = _wrapped(build, wrap)
        whole: Explainer | None = None
        if not one_by_one and wrap is None and per_example(extra, batch):
            # one row per example in the extra arguments: an explainer that runs the model once on the batch as
            # it is (no reruns of changed rows) takes them as they are; the others run one example at a time
            model = Packed(self.forward_func, layout, extra, dtypes, whole_batch=self._whole_batch)
            whole = build(model, layout, packed, -1)
            if whole.reruns_rows:
                whole = None
        if whole is None and (one_by_one or wrap is not None or per_example(extra, batch)):
            raws = []
            for i in range(batch):
                x, lay = packed[i : i + 1], layout
                if wrap is not None and not layout.as_is and bool(x.max() == x.min()):
                    x, lay = anchored(x, layout)
                model = Packed(self.forward_func, lay, example_args(extra, batch, i), dtypes)
                explanations.append(build(model, lay, x, i).explain(x, index if neuron else index[i : i + 1]))
                one = raw_of(explanations[-1])
                raws.append(one if lay.as_is else one.reshape(1, -1)[:, : x[0].numel() - lay.anchor])
            raw = torch.cat(raws)
        else:
            if whole is None:
                model = Packed(self.forward_func, layout, extra, dtypes, whole_batch=self._whole_batch and wrap is None)
                whole = build(model, layout, packed, -1)
            explanations.append(whole.explain(packed, index))
            if model.aggregated and not neuron and bool((index != index[0]).any()):
                raise CaptumTargetError(
                    f"the model returns one output for the whole batch of {batch}, so one target is attributed; "
                    f"got targets {index.tolist()}"
                )
            raw = raw_of(explanations[0])
        if not unpack:  # a layer's attribution: the caller shapes it
            return raw, explanations
        parts = tuple(p.to(d) for p, d in zip(layout.unpack(raw), dtypes))
        return (parts if isinstance(inputs, tuple) else parts[0]), explanations


def raw_of(explanation: Explanation) -> Tensor:
    """camkit's raw attribution of one explanation (a single tensor for every method translated)."""
    raw = explanation.raw
    if not isinstance(raw, Tensor):
        raise NotComputedError(f"{explanation.method}: a raw attribution per layer cannot be returned in captum's form")
    return raw


def _wrapped(build: Build, wrap: Callable[[Explainer, Tensor], Explainer]) -> Build:
    def built(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        return wrap(build(model, layout, x, example), x)

    return built


def has_tuple(target: Any) -> bool:
    """Whether captum's target indexes the output row with tuples (then the row's shape is needed)."""
    if isinstance(target, tuple):
        return True
    return isinstance(target, list) and any(isinstance(t, tuple) for t in target)


def gathered(explanations: list[Explanation], key: str, dtype: torch.dtype) -> Tensor:
    """``extras[key]`` of the explanations, one value per example (per noisy copy under NoiseTunnel), in ``dtype``."""
    values = [e.extras["draw_gaps"] if "draw_gaps" in e.extras else e.extras[key] for e in explanations]
    return torch.cat([v.reshape(-1) for v in values]).to(dtype)


class InternalAttribution(Attribution):
    """captum's base of the layer and neuron attributions."""


class GradientAttribution(Attribution):
    """captum's ``GradientAttribution``."""


class PerturbationAttribution(Attribution):
    """captum's ``PerturbationAttribution``; ``attribute_future`` for forward functions that return futures.

    camkit runs the model synchronously: each future the forward function returns is waited on, and
    the attribution comes back as a completed future.
    """

    _multiply = True

    def attribute_future(self, *args: Any, **kwargs: Any) -> torch.futures.Future[Any]:
        forward = self.forward_func

        def waited(*inputs: Any) -> Any:
            out = forward(*inputs)
            return out.wait() if isinstance(out, torch.futures.Future) else out

        self.forward_func = waited
        try:
            result = self.attribute(*args, **kwargs)
        finally:
            self.forward_func = forward
        done: torch.futures.Future[Any] = torch.futures.Future()
        done.set_result(result)
        return done


class LayerAttribution(InternalAttribution):
    """captum's ``LayerAttribution``: attributions to a layer, and :meth:`interpolate`."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None) -> None:
        super().__init__(forward_func)
        self.layer = layer
        self.device_ids = device_ids

    @staticmethod
    def interpolate(
        layer_attribution: Tensor, interpolate_dims: int | tuple[int, ...], interpolate_mode: str = "nearest"
    ) -> Tensor:
        """Resize layer attributions [B, C, *s] to ``interpolate_dims`` (captum's ``LayerAttribution.interpolate``)."""
        from ....functional.maps import upsample_maps

        size = (interpolate_dims,) if isinstance(interpolate_dims, int) else tuple(interpolate_dims)
        if interpolate_mode == "nearest":
            return torch.nn.functional.interpolate(layer_attribution, size=size, mode="nearest")
        if interpolate_mode in ("linear", "bilinear", "trilinear"):
            return upsample_maps(layer_attribution, size)
        raise NotComputedError(f"interpolate_mode {interpolate_mode!r}: camkit resizes with 'nearest' or linear modes")


class NeuronAttribution(InternalAttribution):
    """captum's ``NeuronAttribution``."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None) -> None:
        super().__init__(forward_func)
        self.layer = layer
        self.device_ids = device_ids
