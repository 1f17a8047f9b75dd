"""Region attributions: feature ablation, Shapley value sampling, KernelSHAP and LIME over
regions of the input, each evaluated as bare masked forwards in bounded chunks.

Every method here splits each sample (a signal [C, T], an image [C, H, W] or a volume or
clip [C, D, H, W]) into regions (a grid of boxes, scikit-image superpixels or a map
given by the caller), decides which *coalitions* of regions to evaluate (all but
one, prefixes of random orders, kernel-weighted random subsets...), runs the model on
``x`` with the regions outside each coalition set to ``baseline``, and turns the scores
into one value per region with an estimator from :mod:`camkit.functional.regions`.

Shared behaviour:

* Scores are the target's model output (no softmax), or a callable target's value.
* Coalitions are drawn per sample from a ``torch.Generator`` seeded with ``seed``, so a
  sample's result does not depend on the rest of the batch (two samples with the same
  number of regions get the same coalitions), nor on ``batch_size``.
* Identical coalitions of a sample (the empty and full ones of every Shapley order, the
  repeats of a sampler) are evaluated once; ``extras["evaluated"]`` counts the forwards.
* ``raw`` is the signed value of each position's region, [B, *S] ([B, K, *S] for [B, K]
  targets); ``extras["regions"]`` holds the region ids used ([B, *S], renumbered
  ``0 .. M_b - 1`` per sample) and ``extras["values"]`` the values per region ([B, M] or
  [B, K, M], zero beyond a sample's own count).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Union

import torch
from torch import Tensor, nn

from ..._internal.checks import check_broadcasts
from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.perturbation import unique_rows
from ...functional.regions import (
    ablation_coalitions,
    coalition_masks,
    exact_kernel_coalitions,
    grid_regions,
    kernel_shap_coalitions,
    lime_kernel,
    permutation_coalitions,
    relabel_regions,
    shapley_from_permutations,
    shapley_permutations,
    solve_kernel_shap,
    superpixel_regions,
    weighted_linear_fit,
)
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.explainer import Explainer
from .._core.forward import (
    RowScorer,
    check_positive,
    expand_targets,
    forward_scores,
    make_explanation,
    masked_forwards,
)
from ..registry import register_method
from ._axes import PerAxis, check_per_axis, per_axis

__all__ = ["FeatureAblation", "KernelShap", "Lime", "RegionAttribution", "RegionSpec", "ShapleyValueSampling"]

RegionSpec = Union[str, Tensor]
_SUPERPIXELS = ("slic", "quickshift", "felzenszwalb")
#: The default grid by number of spatial axes: 64 regions on every rank.
_DEFAULT_CELLS = {1: (64,), 2: (8, 8), 3: (4, 4, 4)}
_AXES = {1: "T", 2: "H, W", 3: "D, H, W"}


class RegionAttribution(Explainer):
    """Base of the region methods: regions, coalitions, chunked masked forwards, per-region values.

    Args:
        model: the model to explain.
        regions: ``"grid"`` (default: ``cells`` boxes), ``"slic"``, ``"quickshift"`` or
            ``"felzenszwalb"`` (scikit-image superpixels of each image, options in
            ``segments``; volumes take ``"slic"`` only, signals none: use the grid, whose
            cells on a signal are contiguous windows), or integer region ids [*S] (the same
            for every sample) or [B, *S].
        cells: grid cells per spatial axis, an int (every axis) or one per axis, e.g.
            ``(rows, cols)``. ``None`` (default): 64 regions on every rank, 64 windows of a
            signal, 8 x 8 on an image, 4 x 4 x 4 on a volume or clip, each count at most
            its axis' length.
        segments: keyword options of the superpixel algorithm (e.g. ``{"n_segments": 100}``).
        baseline: what replaces a removed region: a number or a tensor that broadcasts to
            the input ([C, *S], [1, C, *S] or [B, C, *S]).
        batch_size: masked inputs per forward pass (memory follows it).
        seed: seed of every random choice.
        progress: show a tqdm progress bar.
        output, keep_mode, input_index: see :class:`~camkit.Explainer`.

    Subclasses implement :meth:`_plan` (the coalitions of a sample with M regions) and
    :meth:`_estimate` (the M values from their scores).
    """

    needs_grad = False
    reruns_rows = True
    cost: ClassVar[str] = "masked forwards"
    use_when: ClassVar[str] = ""

    def __init__(
        self,
        model: nn.Module,
        *,
        regions: RegionSpec = "grid",
        cells: PerAxis | None = None,
        segments: Mapping[str, Any] | None = None,
        baseline: float | Tensor = 0.0,
        batch_size: int = 32,
        seed: int = 0,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        if isinstance(regions, str) and regions not in ("grid", *_SUPERPIXELS):
            raise InvalidInputError(
                f"regions must be 'grid', 'slic', 'quickshift', 'felzenszwalb' or a tensor of region ids, got {regions!r}"
            )
        if not isinstance(regions, (str, Tensor)):
            raise InvalidInputError(f"regions must be a string or a tensor of region ids, got {type(regions).__name__}")
        self.cells = check_per_axis("cells", cells)
        if isinstance(baseline, bool) or not isinstance(baseline, (int, float, Tensor)):
            raise InvalidInputError(f"baseline must be a number or a tensor, got {type(baseline).__name__}")
        self.regions = regions
        self.segments = dict(segments or {})
        self.baseline = baseline if isinstance(baseline, Tensor) else float(baseline)
        self.batch_size = check_positive("batch_size", batch_size)
        self.seed = int(seed)
        self.progress = progress

    def grid_cells(self, size: Sequence[int]) -> tuple[int, ...]:
        """The grid's cells per axis for an input of spatial ``size``.

        Example:
            >>> from torch import nn
            >>> import camkit
            >>> camkit.FeatureAblation(nn.Identity()).grid_cells((16, 112, 112))
            (4, 4, 4)
            >>> camkit.FeatureAblation(nn.Identity(), cells=(2, 4)).grid_cells((32, 32))
            (2, 4)
        """
        if self.cells is None:
            return tuple(min(c, int(n)) for c, n in zip(_DEFAULT_CELLS[len(size)], size))
        return per_axis("cells", self.cells, size)

    def region_ids(self, x: Tensor) -> Tensor:
        """The region ids [B, *S] for the batch ``x`` [B, C, *S] (before renumbering)."""
        batch, size = x.shape[0], tuple(x.shape[2:])
        n, spec = len(size), self.regions
        if isinstance(spec, Tensor):
            ok = not spec.is_floating_point() and spec.dtype != torch.bool and tuple(spec.shape[spec.dim() - n :]) == size
            ok = ok and (spec.dim() == n or (spec.dim() == n + 1 and spec.shape[0] in (1, batch)))
            if not ok:
                axes = _AXES[n]
                raise InvalidInputError(
                    f"regions must be integer ids [{axes}] or [B, {axes}] = {[batch, *size]}, got "
                    f"{spec.dtype} {list(spec.shape)}; build one with camkit.functional.regions.grid_regions."
                )
            return spec.to(x.device).long().expand(batch, *size)
        if spec == "grid":
            return grid_regions(size, self.grid_cells(size)).to(x.device).expand(batch, *size)
        return superpixel_regions(x, spec, **self.segments)  # type: ignore[arg-type]

    def _baseline(self, x: Tensor) -> float | Tensor:
        if not isinstance(self.baseline, Tensor):
            return self.baseline
        base = self.baseline.detach().to(device=x.device, dtype=x.dtype)
        axes = _AXES[x.dim() - 2]
        check_broadcasts(base, x, what="input", hint=f"pass [C, {axes}], [1, C, {axes}] or [B, C, {axes}].")
        return base.expand_as(x)

    def _plan(self, m: int, generator: torch.Generator) -> tuple[Tensor, Any]:
        """``(coalitions [N, M] bool, state)`` for a sample with ``m`` regions."""
        raise NotImplementedError

    def _estimate(self, m: int, state: Any, coalitions: Tensor, values: Tensor, score: Tensor) -> Tensor:
        """The values [M, K] from the coalitions' scores [N, K] and the input's score [K]."""
        raise NotImplementedError

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        ids, counts = relabel_regions(self.region_ids(x))  # a rank the regions cannot serve fails before any forward
        classes, scores = forward_scores(self, x, target)
        widest = max(counts)
        plans: dict[int, tuple[Tensor, Any]] = {}
        for m in sorted(set(counts)):
            plans[m] = self._plan(m, torch.Generator().manual_seed(self.seed))
        rows = [torch.full((plans[m][0].shape[0],), b, dtype=torch.long) for b, m in enumerate(counts)]
        keeps = [torch.nn.functional.pad(plans[m][0], (0, widest - m)) for m in counts]
        b_idx, keep = torch.cat(rows), torch.cat(keeps)
        # One forward per distinct (sample, coalition).
        first, inverse = unique_rows(torch.cat([b_idx[:, None], keep.long()], dim=1))
        ub, ukeep = b_idx[first].to(x.device), keep[first].to(x.device)
        scorer = RowScorer(target, expand_targets(classes), softmax=False, output=self.output)
        k = scores.shape[1] if scores.dim() == 2 else 1
        distinct = torch.empty(first.numel(), k, device=x.device)
        for part, _, vals in masked_forwards(
            self, x, ub, lambda part: coalition_masks(torch.index_select(ids, 0, ub[part]), ukeep[part]), scorer,
            batch_size=self.batch_size, baseline=self._baseline(x), progress=self.progress, desc=type(self).__name__,
        ):
            distinct[part] = vals
        values = distinct[inverse.to(x.device)]
        base = (scores if scores.dim() == 2 else scores[:, None]).float()
        per_region = torch.zeros(x.shape[0], k, widest, device=x.device)
        start = 0
        for b, m in enumerate(counts):
            coalitions, state = plans[m]
            stop = start + coalitions.shape[0]
            phi = self._estimate(m, state, coalitions.to(x.device), values[start:stop], base[b])
            per_region[b, :, :m] = phi.T.float()
            start = stop
        flat_ids = ids.reshape(x.shape[0], 1, -1).expand(-1, k, -1)
        raw = per_region.gather(2, flat_ids).reshape(x.shape[0], k, *x.shape[2:])
        multi = scores.dim() == 2
        return make_explanation(
            self.key,
            [raw if multi else raw[:, 0]],
            x,
            classes,
            scores,
            regions=ids,
            values=per_region if multi else per_region[:, 0],
            evaluated=int(first.numel()),
        )


@register_method("featureablation")
class FeatureAblation(RegionAttribution):
    """Feature ablation over regions: each region's value is ``f(x) - f(x with the region removed)``.

    One masked forward per region and image (``M`` per image; a grid of ``cells x cells``
    by default). Deterministic. Removing a region sets its pixels to ``baseline``. See
    :class:`RegionAttribution` for the arguments and the module docstring for the outputs.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
        >>> e = camkit.FeatureAblation(net, cells=(1, 2)).explain(torch.ones(1, 1, 1, 4), target=0)
        >>> e.raw.tolist(), e.extras["evaluated"]
        ([[[3.0, 3.0, 7.0, 7.0]]], 2)
    """

    cost: ClassVar[str] = "1 forward + M masked forwards (M regions per image)"
    use_when: ClassVar[str] = "You want the plain, deterministic effect of removing each region on the score."

    def _plan(self, m: int, generator: torch.Generator) -> tuple[Tensor, Any]:
        return ablation_coalitions(m), None

    def _estimate(self, m: int, state: Any, coalitions: Tensor, values: Tensor, score: Tensor) -> Tensor:
        return score[None, :] - values


@register_method("shapleyvaluesampling")
class ShapleyValueSampling(RegionAttribution):
    """Shapley values of the regions, estimated from random orders (Castro et al. 2009).

    For each of ``samples`` random orders of the M regions, the regions are switched from
    the baseline to the input one by one and each gets the score change it causes; a
    region's value is its mean change over the orders. Each order's changes sum to
    ``f(x) - f(baseline)``, so the estimates satisfy Shapley's efficiency exactly.
    At most ``samples * (M - 1) + 2`` distinct masked forwards per image (repeated
    prefixes, such as the empty and full coalitions, are evaluated once).

    Args:
        samples: number of random orders (default 25).
        regions, cells, segments, baseline, batch_size, seed, progress, output, keep_mode, input_index:
            see :class:`RegionAttribution`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 1, bias=False))  # linear: exact
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
        >>> e = camkit.ShapleyValueSampling(net, samples=3, cells=(1, 2)).explain(torch.ones(1, 1, 1, 4), target=0)
        >>> e.extras["values"].tolist()
        [[3.0, 7.0]]
    """

    cost: ClassVar[str] = "1 forward + at most samples x (M - 1) + 2 masked forwards"
    use_when: ClassVar[str] = "You want Shapley values of regions with exact efficiency and can afford many forwards."

    def __init__(
        self,
        model: nn.Module,
        *,
        samples: int = 25,
        regions: RegionSpec = "grid",
        cells: PerAxis | None = None,
        segments: Mapping[str, Any] | None = None,
        baseline: float | Tensor = 0.0,
        batch_size: int = 32,
        seed: int = 0,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(
            model, regions=regions, cells=cells, segments=segments, baseline=baseline, batch_size=batch_size,
            seed=seed, progress=progress, output=output, keep_mode=keep_mode, input_index=input_index,
        )  # fmt: skip
        self.samples = check_positive("samples", samples)

    def _plan(self, m: int, generator: torch.Generator) -> tuple[Tensor, Any]:
        perms = shapley_permutations(m, self.samples, generator)
        return permutation_coalitions(perms), perms

    def _estimate(self, m: int, state: Any, coalitions: Tensor, values: Tensor, score: Tensor) -> Tensor:
        return shapley_from_permutations(state.to(values.device), values.reshape(self.samples, m + 1, -1))


@register_method("kernelshap")
class KernelShap(RegionAttribution):
    """KernelSHAP (Lundberg & Lee 2017): Shapley values of the regions by weighted regression.

    ``samples`` coalitions are drawn with probability proportional to the Shapley kernel
    (see :func:`~camkit.functional.regions.kernel_shap_coalitions`) and the region values
    fitted by weighted least squares under the efficiency constraint
    ``sum(values) = f(x) - f(baseline)``, which holds exactly. When ``samples >= 2^M - 2``
    every coalition is used once with its exact kernel weight instead, and the values are
    the exact Shapley values. (captum's ``KernelShap`` approximates the constraint by a
    large weight on the empty and full coalitions in an unconstrained regression.)

    Args:
        samples: sampled coalitions per image (default 25) besides the empty and full ones.
        regions, cells, segments, baseline, batch_size, seed, progress, output, keep_mode, input_index:
            see :class:`RegionAttribution`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
        >>> e = camkit.KernelShap(net, cells=(1, 2)).explain(torch.ones(1, 1, 1, 4), target=0)
        >>> [round(v, 4) for v in e.extras["values"][0].tolist()]
        [3.0, 7.0]
    """

    cost: ClassVar[str] = "1 forward + at most samples + 2 masked forwards"
    use_when: ClassVar[str] = "You want Shapley-value estimates of regions from fewer forwards than permutation sampling."

    def __init__(
        self,
        model: nn.Module,
        *,
        samples: int = 25,
        regions: RegionSpec = "grid",
        cells: PerAxis | None = None,
        segments: Mapping[str, Any] | None = None,
        baseline: float | Tensor = 0.0,
        batch_size: int = 32,
        seed: int = 0,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(
            model, regions=regions, cells=cells, segments=segments, baseline=baseline, batch_size=batch_size,
            seed=seed, progress=progress, output=output, keep_mode=keep_mode, input_index=input_index,
        )  # fmt: skip
        self.samples = check_positive("samples", samples)

    def _plan(self, m: int, generator: torch.Generator) -> tuple[Tensor, Any]:
        ends = torch.stack([torch.ones(m, dtype=torch.bool), torch.zeros(m, dtype=torch.bool)])
        if m == 1:
            return ends, None
        if 2**m - 2 <= self.samples:
            z, weights = exact_kernel_coalitions(m)
        else:
            z = kernel_shap_coalitions(m, self.samples, generator)
            weights = torch.ones(z.shape[0], dtype=torch.float64)
        return torch.cat([ends, z]), weights

    def _estimate(self, m: int, state: Any, coalitions: Tensor, values: Tensor, score: Tensor) -> Tensor:
        if state is None:
            return values[0:1] - values[1:2]
        return solve_kernel_shap(coalitions[2:], values[2:], state.to(values.device), values[0], values[1])


@register_method("lime")
class Lime(RegionAttribution):
    """LIME (Ribeiro et al. 2016) over regions: a weighted linear surrogate of the score.

    ``samples`` coalitions keep each region with probability 1/2; each is weighted by
    :func:`~camkit.functional.regions.lime_kernel` (cosine distance of the coalition to
    the full image, exponential kernel of ``kernel_width``) and a linear model with an
    intercept (ridge penalty ``alpha``) is fitted to their scores; the region values are
    its coefficients. captum's default measures the distance between the images and fits
    a Lasso: pass the same kernel and a linear regression to it to compare.

    Args:
        samples: coalitions per image (default 50).
        kernel_width: width of the similarity kernel (default 0.25).
        alpha: ridge penalty of the linear model (default 0: least squares).
        regions, cells, segments, baseline, batch_size, seed, progress, output, keep_mode, input_index:
            see :class:`RegionAttribution`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 1, bias=False))  # linear: recovered exactly
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
        >>> e = camkit.Lime(net, samples=20, cells=(1, 2)).explain(torch.ones(1, 1, 1, 4), target=0)
        >>> [round(v, 4) for v in e.extras["values"][0].tolist()]
        [3.0, 7.0]
    """

    cost: ClassVar[str] = "1 forward + at most samples masked forwards"
    use_when: ClassVar[str] = "You want a local linear surrogate over regions, as in the LIME paper."

    def __init__(
        self,
        model: nn.Module,
        *,
        samples: int = 50,
        kernel_width: float = 0.25,
        alpha: float = 0.0,
        regions: RegionSpec = "grid",
        cells: PerAxis | None = None,
        segments: Mapping[str, Any] | None = None,
        baseline: float | Tensor = 0.0,
        batch_size: int = 32,
        seed: int = 0,
        progress: bool = False,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(
            model, regions=regions, cells=cells, segments=segments, baseline=baseline, batch_size=batch_size,
            seed=seed, progress=progress, output=output, keep_mode=keep_mode, input_index=input_index,
        )  # fmt: skip
        self.samples = check_positive("samples", samples)
        if not kernel_width > 0:
            raise InvalidInputError(f"kernel_width must be > 0, got {kernel_width}")
        if not alpha >= 0:
            raise InvalidInputError(f"alpha must be >= 0, got {alpha}")
        self.kernel_width = float(kernel_width)
        self.alpha = float(alpha)

    def _plan(self, m: int, generator: torch.Generator) -> tuple[Tensor, Any]:
        z = torch.rand(self.samples, m, generator=generator) < 0.5
        return z, lime_kernel(z, self.kernel_width)

    def _estimate(self, m: int, state: Any, coalitions: Tensor, values: Tensor, score: Tensor) -> Tensor:
        coef, _ = weighted_linear_fit(coalitions, values, state.to(values.device), self.alpha)
        return coef
