"""The metrics an evaluation can run, as one table: name -> family, needs, direction, adapter.

Each row is a :class:`MetricSpec`. Its ``compute`` adapter calls a native function of
:mod:`camkit.metrics` on one batch (a :class:`MetricInput`) and returns one score per image,
a float tensor [B] (NaN where the score is undefined). Adding a metric to ``camkit evaluate`` is
one :func:`register_metric` call; nothing else in the evaluation names a metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..metrics import (
    attribution_localisation,
    auc,
    average_drop,
    avg_sensitivity,
    complexity,
    deletion_curve,
    effective_complexity,
    energy_score,
    faithfulness_correlation,
    faithfulness_estimate,
    increase_in_confidence,
    infidelity,
    insertion_curve,
    irof,
    max_sensitivity,
    monotonicity,
    monotonicity_correlation,
    pixel_flipping,
    pointing_score,
    region_auc,
    region_perturbation,
    relevance_mass_accuracy,
    relevance_rank_accuracy,
    road_curve,
    selectivity,
    sensitivity_n,
    sparseness,
    top_k_intersection,
)

__all__ = ["FAMILIES", "METRICS", "MetricInput", "MetricSpec", "register_metric", "select_metrics"]

FAMILIES = ("faithfulness", "robustness", "localisation", "complexity", "randomisation", "axiomatic")
"""The metric families of Quantus, in its order; a metric's family groups it in the reliability checks."""


@dataclass(frozen=True)
class MetricInput:
    """One batch as the adapters see it.

    Attributes:
        model: the classifier (eval mode is set by the metric functions themselves).
        x: model inputs [B, C, H, W] (any rank the metric supports).
        maps: the method's maps [B, H, W], min-max normalised to [0, 1] (NaN for a failed map).
        target: the class explained for each image, long [B] (the same for every method).
        masks: the localisation region, bool [B, H, W], or ``None`` when the data has none.
        generator: a seeded CPU generator for the metrics that draw at random.
        steps: steps of the perturbation curves.
        chunk_size: perturbed images per forward pass.
        explain: ``f(x, target) -> maps`` of the same method, for metrics that re-explain.
        factory: ``f(model) -> explainer``, the same method built on another model (a randomised
            or shifted copy), for the randomisation and input invariance rows.
        representation: ``f(inputs) -> features`` of an inner layer (the CAM layer), for
            relative representation stability.
    """

    model: nn.Module
    x: Tensor
    maps: Tensor
    target: Tensor
    masks: Tensor | None
    generator: torch.Generator
    steps: int = 20
    chunk_size: int = 64
    explain: Callable[[Tensor, Tensor], Tensor] | None = None
    factory: Callable[[nn.Module], Callable[[Tensor, Tensor], Tensor]] | None = None
    representation: Callable[[Tensor], Tensor] | None = None


@dataclass(frozen=True)
class MetricSpec:
    """One row of the table.

    Attributes:
        name: the key used on the command line and in ``scores.csv``.
        family: one of :data:`FAMILIES`.
        compute: ``f(MetricInput) -> Tensor [B]``, one score per image.
        higher_is_better: the direction used for ranks (rank 1 is the best method); ``None`` for a
            metric without one (completeness: 0 is best), kept out of the ranks but written to
            ``scores.csv`` and summarised.
        needs_model: runs the model (perturbation metrics); a model-free metric only reads maps.
        needs_masks: needs a localisation region per image (a manifest region).
        needs_reexplain: explains perturbed inputs again (robustness metrics; costly).
        default: part of the default set (``--metrics`` left out).
        cost: model calls per image, in words.
        summary: what it measures, one line.
    """

    name: str
    family: str
    compute: Callable[[MetricInput], Tensor]
    higher_is_better: bool | None
    needs_model: bool = True
    needs_masks: bool = False
    needs_reexplain: bool = False
    default: bool = True
    cost: str = ""
    summary: str = ""


METRICS: dict[str, MetricSpec] = {}
"""Every metric ``camkit evaluate`` knows, by name, in the order they were registered."""


def register_metric(spec: MetricSpec) -> MetricSpec:
    """Add a row to :data:`METRICS` (a name may be registered once).

    Example:
        >>> import torch
        >>> from camkit.evaluation.table import METRICS, MetricSpec, register_metric
        >>> spec = register_metric(MetricSpec("map_mean", "complexity", lambda i: i.maps.flatten(1).mean(1),
        ...                                   higher_is_better=False, needs_model=False, default=False))
        >>> "map_mean" in METRICS
        True
        >>> del METRICS["map_mean"]
    """
    if spec.family not in FAMILIES:
        raise InvalidInputError(f"metric {spec.name!r}: family must be one of {FAMILIES}, got {spec.family!r}")
    if spec.name in METRICS:
        raise InvalidInputError(f"a metric named {spec.name!r} is already registered")
    METRICS[spec.name] = spec
    return spec


def select_metrics(names: str | Iterable[str] | None, *, have_masks: bool) -> list[MetricSpec]:
    """The metrics to run: ``None`` or ``"default"`` (the default set), ``"all"``, or names.

    In the default set and in ``all``, metrics that need masks are left out when the data has
    no region; named explicitly, they are an error, as is an unknown name.

    Example:
        >>> from camkit.evaluation.table import select_metrics
        >>> [m.name for m in select_metrics("deletion,pointing_game", have_masks=True)]
        ['deletion', 'pointing_game']
        >>> "pointing_game" in [m.name for m in select_metrics(None, have_masks=False)]
        False
    """
    if names is None or names == "default" or names == ["default"]:
        return [m for m in METRICS.values() if m.default and (have_masks or not m.needs_masks)]
    if names == "all" or names == ["all"]:
        return [m for m in METRICS.values() if have_masks or not m.needs_masks]
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not wanted:
        raise InvalidInputError("--metrics is empty; name metrics, or 'default' or 'all'")
    unknown = [n for n in wanted if n not in METRICS]
    if unknown:
        raise InvalidInputError(f"unknown metric(s) {unknown}; known: {', '.join(METRICS)} (or 'default', 'all')")
    chosen = [METRICS[n] for n in dict.fromkeys(wanted)]
    masked = [m.name for m in chosen if m.needs_masks]
    if masked and not have_masks:
        raise InvalidInputError(
            f"metric(s) {masked} need a localisation region per image, but the data has none; give a CSV manifest "
            "with region columns (NAME_x0..NAME_y1 or NAME_mask) and --region NAME, or leave these metrics out"
        )
    return chosen


# ---------------------------------------------------------------- the rows


def _deletion(i: MetricInput) -> Tensor:
    fractions, scores = deletion_curve(
        i.model, i.x, i.maps, i.target, steps=i.steps, baseline=0.0, softmax=True, chunk_size=i.chunk_size
    )
    return auc(fractions, scores)


def _insertion(i: MetricInput) -> Tensor:
    fractions, scores = insertion_curve(
        i.model, i.x, i.maps, i.target, steps=i.steps, baseline="blur", softmax=True, chunk_size=i.chunk_size
    )
    return auc(fractions, scores)


def _road(order: str) -> Callable[[MetricInput], Tensor]:
    def compute(i: MetricInput) -> Tensor:
        _, scores = road_curve(
            i.model, i.x, i.maps, i.target, order=order, softmax=True, chunk_size=i.chunk_size, generator=i.generator
        )
        return scores.mean(dim=1)

    return compute


def _masks(i: MetricInput) -> Tensor:
    if i.masks is None:
        raise InvalidInputError("this metric needs localisation masks and the batch has none")
    return i.masks


def _average_drop(i: MetricInput) -> Tensor:
    return average_drop(i.model, i.x, i.maps, i.target, chunk_size=i.chunk_size)


def _increase(i: MetricInput) -> Tensor:
    return increase_in_confidence(i.model, i.x, i.maps, i.target, chunk_size=i.chunk_size)


def _pointing(i: MetricInput) -> Tensor:
    return pointing_score(i.maps, _masks(i))  # no region on this image: no score (not a miss)


def _energy(i: MetricInput) -> Tensor:
    return energy_score(i.maps, _masks(i))


def _per_step(i: MetricInput) -> int:
    """Features removed per step so that a one-feature-at-a-time curve takes ``steps`` steps."""
    return max(1, -(-i.maps[0].numel() // i.steps))


def _no_region_nan(i: MetricInput, values: Tensor) -> Tensor:
    masks = _masks(i)
    values = values.to(i.maps.dtype)
    return torch.where(masks.flatten(1).any(dim=1), values, torch.full_like(values, float("nan")))


def _top_k(i: MetricInput) -> Tensor:
    k = max(1, round(0.02 * i.maps[0].numel()))  # Quantus's default k = 1000 is 2% of 224 x 224
    return top_k_intersection(i.maps, _masks(i), k)


def _faithfulness_correlation(i: MetricInput) -> Tensor:
    subset = max(1, min(224, i.maps[0].numel() // 4))
    return faithfulness_correlation(i.model, i.x, i.maps, i.target, runs=50, subset_size=subset, softmax=True,
                                    generator=i.generator, chunk_size=i.chunk_size)  # fmt: skip


def _sensitivity_n(i: MetricInput) -> Tensor:
    _, correlations = sensitivity_n(i.model, i.x, i.maps, i.target, samples=10, softmax=True, generator=i.generator,
                                    chunk_size=i.chunk_size)  # fmt: skip
    return correlations.nanmean(dim=1)


def _patch(i: MetricInput) -> int:
    """A patch side that cuts the smallest spatial axis into about 8 patches."""
    return max(1, min(i.maps.shape[1:]) // 8)


def _region_perturbation(i: MetricInput) -> Tensor:
    drops = region_perturbation(i.model, i.x, i.maps, i.target, patch_size=_patch(i), regions=i.steps, softmax=True,
                                chunk_size=i.chunk_size)  # fmt: skip
    return drops.mean(dim=1)  # AOPC


def _selectivity(i: MetricInput) -> Tensor:
    scores = selectivity(i.model, i.x, i.maps, i.target, patch_size=_patch(i), softmax=True, chunk_size=i.chunk_size)
    steps = torch.linspace(0, 1, scores.shape[1], dtype=scores.dtype, device=scores.device)
    return torch.trapezoid(scores, steps, dim=1)


def _sensitivity(kind: Callable[..., Tensor]) -> Callable[[MetricInput], Tensor]:
    def compute(i: MetricInput) -> Tensor:
        if i.explain is None:
            raise InvalidInputError("this metric explains perturbed inputs again and needs the method's explainer")
        return kind(i.explain, i.x, i.target, model=i.model, maps=i.maps, samples=10, generator=i.generator,
                    chunk_size=i.chunk_size)  # fmt: skip

    return compute


def _curve_mean(i: MetricInput) -> Tensor:
    return pixel_flipping(i.model, i.x, i.maps, i.target, features_in_step=_per_step(i), softmax=True,
                          chunk_size=i.chunk_size).mean(dim=1)  # fmt: skip


for _spec in (
    MetricSpec("deletion", "faithfulness", _deletion, False, cost="steps forward passes",
               summary="AUC of the softmax score as the most relevant pixels are set to 0 (Petsiuk et al. 2018)"),
    MetricSpec("insertion", "faithfulness", _insertion, True, cost="steps forward passes",
               summary="AUC of the softmax score as the most relevant pixels are put back on a blurred copy"),
    MetricSpec("average_drop", "faithfulness", _average_drop, False, cost="1 forward pass",
               summary="relative drop of the softmax score when only the map is shown (Chattopadhay et al. 2018)"),
    MetricSpec("increase_in_confidence", "faithfulness", _increase, True, cost="1 forward pass",
               summary="1 when showing only the map raises the softmax score, else 0"),
    MetricSpec("road_morf", "faithfulness", _road("morf"), False, default=False, cost="9 imputations and forward passes",
               summary="mean softmax score as the most relevant pixels are imputed (ROAD, Rong et al. 2022)"),
    MetricSpec("road_lerf", "faithfulness", _road("lerf"), True, default=False, cost="9 imputations and forward passes",
               summary="mean softmax score as the least relevant pixels are imputed (ROAD, LeRF)"),
    MetricSpec("pointing_game", "localisation", _pointing, True, needs_model=False, needs_masks=True,
               cost="none (reads the map)", summary="1 when the map's maximum lies in the region (Zhang et al. 2016)"),
    MetricSpec("energy_pointing_game", "localisation", _energy, True, needs_model=False, needs_masks=True,
               cost="none (reads the map)", summary="share of the map's energy inside the region (Wang et al. 2020)"),
    MetricSpec("pixel_flipping", "faithfulness", _curve_mean, False, default=False, cost="steps forward passes",
               summary="mean softmax score as features are set to 0 in steps, most relevant first (Bach et al. 2015)"),
    MetricSpec("faithfulness_correlation", "faithfulness", _faithfulness_correlation, True, default=False,
               cost="50 forward passes", summary="correlation of random subsets' relevance with the score drop "
               "when they are removed (Bhatt et al. 2020)"),
    MetricSpec("faithfulness_estimate", "faithfulness",
               lambda i: faithfulness_estimate(i.model, i.x, i.maps, i.target, features_in_step=_per_step(i),
                                               softmax=True, chunk_size=i.chunk_size),
               True, default=False, cost="steps forward passes",
               summary="correlation of each step's relevance with its score drop (Alvarez-Melis and Jaakkola 2018)"),
    MetricSpec("monotonicity", "faithfulness",
               lambda i: monotonicity(i.model, i.x, i.maps, i.target, features_in_step=_per_step(i), softmax=True,
                                      chunk_size=i.chunk_size),
               True, default=False, cost="steps forward passes",
               summary="1 when adding features by increasing relevance never lowers the score (Arya et al. 2019)"),
    MetricSpec("monotonicity_correlation", "faithfulness",
               lambda i: monotonicity_correlation(i.model, i.x, i.maps, i.target, samples=10,
                                                  features_in_step=_per_step(i), generator=i.generator, softmax=True,
                                                  chunk_size=i.chunk_size),
               True, default=False, cost="10 x steps forward passes",
               summary="Spearman correlation of relevance with the score's sensitivity (Nguyen and Martinez 2020)"),
    MetricSpec("infidelity", "robustness",
               lambda i: infidelity(i.model, i.x, i.maps, i.target, samples=10, normalize=True, softmax=True,
                                    generator=i.generator, chunk_size=i.chunk_size),
               False, default=False, cost="10 forward passes",
               summary="normalised infidelity of Gaussian perturbations (Yeh et al. 2019), as captum computes it"),
    MetricSpec("sensitivity_n", "faithfulness", _sensitivity_n, True, default=False, cost="100 forward passes",
               summary="correlation of subsets' relevance with their score drop, mean over 10 sizes (Ancona et al. 2018)"),
    MetricSpec("region_perturbation", "faithfulness", _region_perturbation, True, default=False,
               cost="steps forward passes", summary="AOPC: mean softmax drop as the most relevant patches (1/8 of the "
               "side) are removed, steps patches (Samek et al. 2016)"),
    MetricSpec("selectivity", "faithfulness", _selectivity, False, default=False, cost="64 forward passes",
               summary="area under the softmax score as all patches are removed, most relevant first "
               "(Montavon et al. 2018)"),
    MetricSpec("irof", "faithfulness",
               lambda i: irof(i.model, i.x, i.maps, i.target, chunk_size=i.chunk_size).to(i.maps.dtype), True,
               default=False, cost="one forward pass per SLIC segment",
               summary="area over the relative score as superpixels are removed, most relevant first "
               "(Rieger and Hansen 2020)"),
    MetricSpec("avg_sensitivity", "robustness", _sensitivity(avg_sensitivity), False, needs_reexplain=True,
               default=False, cost="10 explanations", summary="mean relative change of the map under uniform noise "
               "of radius 0.2 (Yeh et al. 2019)"),
    MetricSpec("max_sensitivity", "robustness", _sensitivity(max_sensitivity), False, needs_reexplain=True,
               default=False, cost="10 explanations", summary="largest relative change of the map under uniform "
               "noise of radius 0.2 (Yeh et al. 2019; captum's sensitivity_max)"),
    MetricSpec("sparseness", "complexity", lambda i: sparseness(i.maps), True, needs_model=False, default=False,
               cost="none (reads the map)", summary="Gini index of the map (Chalasani et al. 2020)"),
    MetricSpec("complexity", "complexity", lambda i: complexity(i.maps), False, needs_model=False, default=False,
               cost="none (reads the map)", summary="entropy of the map's share per pixel (Bhatt et al. 2020)"),
    MetricSpec("effective_complexity", "complexity", lambda i: effective_complexity(i.maps).to(i.maps.dtype), False,
               needs_model=False, default=False, cost="none (reads the map)",
               summary="pixels whose relevance passes a threshold (Nguyen and Martinez 2020)"),
    MetricSpec("attribution_localisation", "localisation",
               lambda i: _no_region_nan(i, attribution_localisation(i.maps, _masks(i))), True, needs_model=False,
               needs_masks=True, default=False, cost="none (reads the map)",
               summary="share of positive relevance inside the region (Kohlbrenner et al. 2020)"),
    MetricSpec("top_k_intersection", "localisation", _top_k, True, needs_model=False, needs_masks=True, default=False,
               cost="none (reads the map)", summary="share of the top 2% pixels inside the region (Theiner et al. 2021)"),
    MetricSpec("relevance_rank_accuracy", "localisation",
               lambda i: _no_region_nan(i, relevance_rank_accuracy(i.maps, _masks(i))), True, needs_model=False,
               needs_masks=True, default=False, cost="none (reads the map)",
               summary="share of the region's size in top-ranked pixels that lie inside it (Arras et al. 2021)"),
    MetricSpec("relevance_mass_accuracy", "localisation",
               lambda i: _no_region_nan(i, relevance_mass_accuracy(i.maps, _masks(i))), True, needs_model=False,
               needs_masks=True, default=False, cost="none (reads the map)",
               summary="relevance inside the region over all relevance (Arras et al. 2021)"),
    MetricSpec("region_auc", "localisation", lambda i: _no_region_nan(i, region_auc(i.maps, _masks(i))), True,
               needs_model=False, needs_masks=True, default=False, cost="none (reads the map)",
               summary="ROC AUC of the map as a detector of the region's pixels (Fawcett 2006)"),
):  # fmt: skip
    register_metric(_spec)
del _spec
