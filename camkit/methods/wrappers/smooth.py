"""Wrappers that average any camkit explainer over perturbed copies of the input.

:class:`SmoothGrad` adds Gaussian noise; :class:`AugSmooth` flips and rescales. Both take
an *explainer* (CAMs, pixel attributions, anything with ``explain``), not a model, so they
are not in the method registry, whose entries are built as ``cls(model, ...)``; the
``method`` of their :class:`~camkit.Explanation` names both, e.g. ``"smoothgrad(gradcam)"``.

The target is resolved once on the clean input (top-1 of the clean image, not of each
noisy copy), and ``scores`` are the clean input's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._internal.checks import BATCH_SHAPES
from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.attribution import SmoothKind, aggregate_samples
from ...functional.maps import interpolation_mode, normalize_maps, upsample_maps
from ...targets.classes import Target
from ...targets.tokens import TokenTarget
from .._core.binding import select_rows
from .._core.explainer import Explainer
from .._core.output import finish_maps

__all__ = ["AugSmooth", "SmoothGrad"]

_KINDS = ("smoothgrad", "smoothgrad_sq", "vargrad")


def _as_tuple(raw: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    return raw if isinstance(raw, tuple) else (raw,)


def _maps_from_raw(explainer: Explainer, raws: tuple[Tensor, ...], size: Sequence[int]) -> tuple[Tensor, Tensor]:
    """The wrapped explainer's own output contract applied to aggregated raw maps."""
    own = getattr(explainer, "maps_from_raw", None)
    if own is not None and len(raws) == 1:
        maps, flat = own(raws[0], size)
        return maps, flat
    return finish_maps(raws, size)


class _Wrapper(Explainer):
    """Shared parts of the wrappers: the wrapped explainer, clean targets, input checks."""

    reruns_rows = True

    def __init__(self, explainer: Explainer) -> None:
        if not isinstance(explainer, Explainer):
            raise TypeError(f"explainer must be a camkit explainer (e.g. camkit.GradCAM(model, layer)), got {type(explainer).__name__}")
        super().__init__(
            explainer.wrapped_model, output=explainer.output, keep_mode=explainer.keep_mode, input_index=explainer.input_index
        )
        self.explainer = explainer

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.explainer!r})"

    def _check_input(self, x: Tensor) -> None:
        self.explainer._check_input(x)

    def _bind_inputs(self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> Any:
        if inputs is not None:
            raise InvalidInputError(
                f"{type(self).__name__} explains changed copies of x in batches of its own, which other positional "
                "inputs cannot follow; pass per-call keyword inputs with kwargs= or wrap the model so x is its "
                "only positional input."
            )
        return super()._bind_inputs(x, inputs, kwargs)

    def _inner(self, x: Tensor, target: Target, rows: Tensor) -> Explanation:
        """The wrapped explainer on a batch of changed images (row ``i`` made from sample ``rows[i]``).

        The call's keyword inputs follow the rows: those with one row per sample are indexed by
        ``rows``, shared ones go in as they are (see :meth:`Explainer._call_model_rows`).
        """
        call = select_rows(self._call, rows)
        return self.explainer.explain(x, target, kwargs=None if call is None else call.kwargs)

    def _clean_target(self, x: Tensor, target: Target) -> tuple[Tensor | None, Tensor]:
        with torch.no_grad():
            classes, scores = self._target_scores(x, target)
        return classes, scores.detach()

    @staticmethod
    def _rows_target(classes: Tensor | None, target: Target, rows: Tensor) -> Target:
        if classes is not None:
            return classes[rows]
        # token positions given per sample follow the rows (detection targets keep their own rule)
        return target.for_rows(rows) if isinstance(target, TokenTarget) else target


class SmoothGrad(_Wrapper):
    """SmoothGrad (Smilkov et al. 2017) and its variants around any camkit explainer.

    The wrapped explainer runs on ``samples`` noisy copies ``x + sigma * (max(x) - min(x)) * N(0, 1)``
    of each input (the spread is per input, over its channels and every spatial axis), batched
    ``max_batch`` inputs at a time. Any rank: signals [B, C, T], images [B, C, H, W], volumes
    and videos [B, C, D, H, W]; maps come back at the input's size ([B, *S]). Its
    *raw* maps are aggregated per image: ``"smoothgrad"`` the mean, ``"smoothgrad_sq"`` the
    mean of squares, ``"vargrad"`` the variance (Adebayo et al. 2018); the wrapped
    explainer's own contract then turns the aggregate into ``maps`` (for CAMs upsample and
    min-max, for pixel attributions ``max_c |raw|`` and min-max).

    When the wrapped explainer reports a completeness gap per image (``extras["completeness_gap"]``
    or ``extras["delta"]``: integrated gradients, DeepLift, LRP), ``extras["draw_gaps"]`` holds each
    noisy copy's, [samples, B].

    With a ``seed`` the noise, and so the result, is the same on every call and does not
    depend on ``max_batch`` (up to float rounding): each noisy copy of the batch is drawn in
    turn from a generator on the input's device. Without one, the seed is drawn from
    torch's global generator (so ``torch.manual_seed`` fixes it too).

    Args:
        explainer: any camkit explainer, e.g. ``camkit.GradCAM(model, "layer4")``.
        samples: noisy copies per image (default 25).
        sigma: noise standard deviation as a fraction of each image's value range (default 0.15).
        kind: ``"smoothgrad"``, ``"smoothgrad_sq"`` or ``"vargrad"``.
        max_batch: the most noisy images per call of the wrapped explainer (default 32).
        seed: the noise seed.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> smooth = camkit.SmoothGrad(camkit.GradCAM(net, "0"), samples=4, seed=0)
        >>> explanation = smooth.explain(torch.rand(2, 3, 8, 8))
        >>> tuple(explanation.maps.shape), explanation.method
        ((2, 8, 8), 'smoothgrad(gradcam)')
    """

    cost: ClassVar[str] = "samples x the wrapped method"
    use_when: ClassVar[str] = (
        "The wrapped method's map is noisy; average it over noisy copies of the input."
    )

    def __init__(
        self,
        explainer: Explainer,
        *,
        samples: int = 25,
        sigma: float = 0.15,
        kind: SmoothKind = "smoothgrad",
        max_batch: int = 32,
        seed: int | None = None,
    ) -> None:
        super().__init__(explainer)
        for name, value in (("samples", samples), ("max_batch", max_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(sigma, (int, float)) or isinstance(sigma, bool) or not sigma >= 0:
            raise InvalidInputError(f"sigma must be a number >= 0 (a fraction of the image's value range), got {sigma!r}")
        if kind not in _KINDS:
            raise InvalidInputError(f"kind must be one of {', '.join(map(repr, _KINDS))}, got {kind!r}")
        self.samples = samples
        self.sigma = float(sigma)
        self.kind: SmoothKind = kind
        self.max_batch = max_batch
        self.seed = seed

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        classes, scores = self._clean_target(x, target)
        batch = x.shape[0]
        every = tuple(range(1, x.dim()))  # channels and every spatial axis
        spread = self.sigma * (x.amax(dim=every, keepdim=True) - x.amin(dim=every, keepdim=True))
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, (1,)))
        generator = torch.Generator(device=x.device)
        generator.manual_seed(seed)
        acc = torch.float32 if x.device.type == "mps" else torch.float64
        sums: list[Tensor] = []
        squares: list[Tensor] = []
        layers: tuple[str, ...] = ()
        pending: list[Tensor] = []
        gaps: list[Tensor] = []  # each noisy copy's own gap, for inner methods that report one
        done = 0

        def flush(count: int) -> None:
            nonlocal pending, done, layers
            noisy = torch.cat(pending)
            chunk, rest = noisy[:count], noisy[count:]
            pending = [rest] if rest.shape[0] else []
            rows = torch.arange(done, done + count, device=x.device) % batch
            explanation = self._inner(chunk, self._rows_target(classes, target, rows), rows)
            layers = explanation.layers
            gap = explanation.extras.get("completeness_gap", explanation.extras.get("delta"))
            if isinstance(gap, Tensor):
                gaps.append(gap.detach())
            for i, raw in enumerate(_as_tuple(explanation.raw)):
                raw = raw.detach().to(acc)
                if len(sums) <= i:
                    sums.append(raw.new_zeros((batch, *raw.shape[1:])))
                    squares.append(raw.new_zeros((batch, *raw.shape[1:])))
                sums[i].index_add_(0, rows, raw)
                squares[i].index_add_(0, rows, raw * raw)
            done += count

        for _ in range(self.samples):
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            pending.append(x + spread * noise)
            while sum(p.shape[0] for p in pending) >= self.max_batch:
                flush(self.max_batch)
        if pending:
            flush(sum(p.shape[0] for p in pending))
        raws = tuple(aggregate_samples(s, q, self.samples, self.kind).float() for s, q in zip(sums, squares))
        maps, flat = _maps_from_raw(self.explainer, raws, tuple(x.shape[2:]))
        return Explanation(
            maps=maps.to(x.device),
            raw=raws[0] if len(raws) == 1 else raws,
            target=classes,
            scores=scores,
            flat=flat.to(x.device),
            method=f"{self.kind}({self.explainer.key})",
            layers=layers,
            extras={
                "samples": self.samples, "sigma": self.sigma, "kind": self.kind, "seed": seed,
                **({"draw_gaps": torch.cat(gaps).reshape(self.samples, batch, *gaps[0].shape[1:])} if gaps else {}),
            },
        )


class AugSmooth(_Wrapper):
    """Test-time augmentation around any camkit explainer: flips and rescales, mapped back, averaged.

    For each scale ``s`` the batch is resized to ``s`` times each spatial side (rounded;
    linear for a signal, bilinear for an image, antialiased when shrinking, trilinear for a
    volume or a video, whose time axis is resized too) and joined by its mirrored copies,
    one per axis in ``flip``; the wrapped explainer explains it in one call. Every map is
    resized back to the input size and mirrored back where the input was mirrored, then
    the maps (each already in [0, 1]) are averaged and min-max normalised again. ``raw`` is
    the average of the raw maps mapped back the same way, at the input's resolution (its
    magnitude mixes scales; use ``maps`` to compare). Unlike pytorch-grad-cam's
    ``aug_smooth``, scales are spatial, not intensity multipliers: no value of the input is
    changed, so a one-channel scan gets no colour jitter.

    Which mirrors (``flip``): ``True`` (the default) is the left-right mirror, along the last
    axis W, of an image [B, C, H, W], a volume or a video [B, C, D, H, W]. The depth or time
    axis is never mirrored unless asked: a video played backwards, or a scan turned head to
    foot, is not what the model was trained on. A signal [B, C, T] has no left-right axis,
    only time, so ``flip=True`` refuses it; pass ``flip=False``, or ``flip=(-1,)`` to add the
    time-reversed signal on purpose. A tuple names the spatial axes to mirror, counted from
    the last: ``-1`` (W, a signal's T), ``-2`` (H), ``-3`` (D, a video's time); each adds one
    mirrored copy. ``extras["flip_axes"]`` says which were used.

    Args:
        explainer: any camkit explainer.
        flip: ``True`` (the left-right mirror, default), ``False`` or a tuple of spatial axes
            (see above).
        scales: spatial scale factors (default ``(1.0, 0.9, 1.1)``); use ``(1.0,)`` for
            models that accept only one input size (a video model with a fixed frame count).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(1, 3, 8, 8)
        >>> maps = camkit.AugSmooth(camkit.GradCAM(net, "0"))(x + x.flip(-1))
        >>> torch.allclose(maps, maps.flip(-1), atol=1e-6)
        True
    """

    cost: ClassVar[str] = "(2 with flip) x len(scales) x the wrapped method"
    use_when: ClassVar[str] = (
        "You want a map that is stable under flips and small rescales of the input."
    )

    def __init__(
        self, explainer: Explainer, *, flip: bool | Sequence[int] = True, scales: Sequence[float] = (1.0, 0.9, 1.1)
    ) -> None:
        super().__init__(explainer)
        scales = tuple(float(s) for s in scales)
        if not scales or any(not s > 0 for s in scales):
            raise InvalidInputError(f"scales must be a non-empty sequence of positive factors, got {scales!r}")
        if not isinstance(flip, bool):
            axes = tuple(flip) if isinstance(flip, Sequence) else (flip,)
            if any(isinstance(a, bool) or a not in (-1, -2, -3) for a in axes) or len(set(axes)) != len(axes):
                raise InvalidInputError(
                    "flip must be True (the left-right mirror), False or distinct spatial axes counted from the last "
                    f"(-1: W or a signal's T, -2: H, -3: D or a video's time), got {flip!r}"
                )
            flip = axes
        self.flip: bool | tuple[int, ...] = flip
        self.scales = scales

    def _flip_axes(self, x: Tensor) -> tuple[int, ...]:
        """The spatial axes (negative, from the last) mirrored for the batch ``x``."""
        n = x.dim() - 2
        if self.flip is False:
            return ()
        if self.flip is True:
            if n == 1:
                raise InvalidInputError(
                    f"AugSmooth(flip=True) mirrors left and right, but x {list(x.shape)} is a signal [B, C, T] whose "
                    "one axis is time, and a time-reversed signal is another signal; pass flip=False to average over "
                    "scales only, or flip=(-1,) to add the time-reversed copy on purpose"
                )
            return (-1,)
        if min(self.flip) < -n:
            raise InvalidInputError(
                f"flip axis {min(self.flip)} needs {-min(self.flip)} spatial axes, but x {list(x.shape)} has {n} "
                f"({BATCH_SHAPES[x.dim()]}); mirror axes from -1 to {-n}"
            )
        return self.flip

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        classes, scores = self._clean_target(x, target)
        batch, size = x.shape[0], tuple(x.shape[2:])
        axes = self._flip_axes(x)
        copies = 1 + len(axes)
        rows = torch.arange(batch * copies, device=x.device) % batch
        inner_target = self._rows_target(classes, target, rows)
        map_sum = torch.zeros((), device=x.device)
        raw_sums: list[Tensor] = []
        layers: tuple[str, ...] = ()
        for scale in self.scales:
            scaled = self._resize(x, scale)
            batches = [scaled, *(scaled.flip(axis) for axis in axes)]
            explanation = self._inner(torch.cat(batches) if axes else scaled, inner_target, rows)
            layers = explanation.layers
            back = self._map_back(explanation.maps, size, batch, axes)
            map_sum = map_sum + back
            for i, raw in enumerate(_as_tuple(explanation.raw)):
                back_raw = self._map_back(raw.detach().float(), size, batch, axes)
                if len(raw_sums) <= i:
                    raw_sums.append(back_raw)
                else:
                    raw_sums[i] = raw_sums[i] + back_raw
        count = len(self.scales) * copies
        maps, flat = normalize_maps(map_sum / count, spatial_dims=len(size))
        raws = tuple(r / count for r in raw_sums)
        return Explanation(
            maps=maps,
            raw=raws[0] if len(raws) == 1 else raws,
            target=classes,
            scores=scores,
            flat=flat,
            method=f"augsmooth({self.explainer.key})",
            layers=layers,
            extras={"flip": self.flip, "flip_axes": axes, "scales": self.scales},
        )

    @staticmethod
    def _resize(x: Tensor, scale: float) -> Tensor:
        if scale == 1.0:
            return x
        n = x.dim() - 2
        size = tuple(max(1, round(side * scale)) for side in x.shape[2:])
        # torch antialiases 2-D resizing only; a 10% shrink of a signal or a volume aliases little
        antialias = scale < 1.0 and n == 2
        return F.interpolate(x, size=size, mode=interpolation_mode(n), align_corners=False, antialias=antialias)

    @staticmethod
    def _map_back(maps: Tensor, size: Sequence[int], batch: int, axes: tuple[int, ...]) -> Tensor:
        """Maps [copies*B, ..., *s] to [B, ..., *S] summed over the copies, each mirrored back along its axis."""
        resized = upsample_maps(maps, tuple(size))
        if not axes:
            return resized
        total = resized[:batch]
        for k, axis in enumerate(axes, start=1):
            total = total + resized[k * batch : (k + 1) * batch].flip(axis)
        return total
