"""Faithfulness measures for saliency maps: tensors in, tensors out, batched.

* :func:`deletion_curve`, :func:`insertion_curve`, :func:`auc` (Petsiuk et al. 2018);
* :func:`average_drop`, :func:`increase_in_confidence` (Chattopadhay et al. 2018);
* :func:`pointing_game` (Zhang et al. 2016), :func:`energy_pointing_game` (Wang et al. 2020), and as
  scores NaN where a map has no region: :func:`pointing_score`, :func:`energy_score`;
* :func:`spread_and_border`: a map's energy share in its top positions and in its outer frame;
* localisation against a region: :func:`attribution_localisation`, :func:`top_k_intersection`,
  :func:`relevance_rank_accuracy`, :func:`relevance_mass_accuracy`, :func:`region_auc`, :func:`focus`;
* :func:`road_curve` with :func:`noisy_linear_imputation` (ROAD, Rong et al. 2022);
* :func:`arcc` with :func:`arcc_complexity` and :func:`coherency` (pytorch-grad-cam 1.5.7's ARCC), over
  :func:`pearson_rows`;
* :func:`randomization_check` (Adebayo et al. 2018), with :func:`spearman` and :func:`ssim`;
* robustness: :func:`avg_sensitivity`, :func:`max_sensitivity`, :func:`local_lipschitz_estimate`,
  :func:`continuity`, :func:`consistency`, :func:`relative_input_stability`,
  :func:`relative_output_stability`, :func:`relative_representation_stability`;
* randomisation: :func:`mprt` (cascading, independent, smoothed), :func:`efficient_mprt`, :func:`random_logit`;
* generated text: :func:`token_deletion_curve`, :func:`token_insertion_curve` (a token's log-probability
  as image units are hidden or shown), :func:`unit_scores` (a word's map averaged over each unit's box);
* :class:`MetricAccumulator`, :class:`CurveAccumulator` to aggregate over a dataset.

Perturbation metrics run the model without gradients, in eval mode (every module's flag
restored after), on chunks of at most ``chunk_size`` images; the model is never modified.
"""

from .accumulate import CurveAccumulator, MetricAccumulator
from .arcc import ARCCScores, arcc, arcc_complexity, coherency, pearson_rows
from .axiomatic import completeness, input_invariance, non_sensitivity
from .complexity import complexity, effective_complexity, sparseness
from .deletion import (
    Baseline,
    auc,
    average_drop,
    blur_baseline,
    deletion_curve,
    increase_in_confidence,
    insertion_curve,
)
from .faithfulness import faithfulness_correlation, faithfulness_estimate, pixel_flipping
from .infidelity import infidelity, sensitivity_n
from .localisation import (
    attribution_localisation,
    focus,
    region_auc,
    relevance_mass_accuracy,
    relevance_rank_accuracy,
    top_k_intersection,
)
from .logit import random_logit
from .monotonicity import monotonicity, monotonicity_correlation
from .pointing import energy_pointing_game, energy_score, pointing_game, pointing_score, region_masks
from .randomisation import MPRTResult, efficient_mprt, mprt
from .regions import irof, region_perturbation, selectivity
from .road import noisy_linear_imputation, road_curve
from .robustness import (
    avg_sensitivity,
    consistency,
    continuity,
    local_lipschitz_estimate,
    max_sensitivity,
)
from .sanity import RandomizationResult, randomization_check, spearman, ssim
from .spread import spread_and_border
from .stability import relative_input_stability, relative_output_stability, relative_representation_stability
from .sufficiency import sufficiency
from .tokens import token_deletion_curve, token_insertion_curve, unit_scores

__all__ = [
    "ARCCScores",
    "Baseline",
    "CurveAccumulator",
    "MPRTResult",
    "MetricAccumulator",
    "RandomizationResult",
    "arcc",
    "arcc_complexity",
    "attribution_localisation",
    "auc",
    "average_drop",
    "avg_sensitivity",
    "blur_baseline",
    "coherency",
    "completeness",
    "complexity",
    "consistency",
    "continuity",
    "deletion_curve",
    "effective_complexity",
    "efficient_mprt",
    "energy_pointing_game",
    "energy_score",
    "faithfulness_correlation",
    "faithfulness_estimate",
    "focus",
    "increase_in_confidence",
    "infidelity",
    "input_invariance",
    "insertion_curve",
    "irof",
    "local_lipschitz_estimate",
    "max_sensitivity",
    "monotonicity",
    "monotonicity_correlation",
    "mprt",
    "noisy_linear_imputation",
    "non_sensitivity",
    "pearson_rows",
    "pixel_flipping",
    "pointing_game",
    "pointing_score",
    "random_logit",
    "randomization_check",
    "region_auc",
    "region_masks",
    "region_perturbation",
    "relative_input_stability",
    "relative_output_stability",
    "relative_representation_stability",
    "relevance_mass_accuracy",
    "relevance_rank_accuracy",
    "road_curve",
    "selectivity",
    "sensitivity_n",
    "sparseness",
    "spearman",
    "spread_and_border",
    "ssim",
    "sufficiency",
    "token_deletion_curve",
    "token_insertion_curve",
    "top_k_intersection",
    "unit_scores",
]
