"""The statistics of an evaluation, on score tables: images x methods, one table per metric.

Everything here takes numpy arrays ``scores`` [N images, K methods] with the images that have a
score for every method (rows with NaN are dropped by :func:`complete_rows`), and a direction
(``higher_is_better``). Ranks are 1 for the best method of an image (ties share the average
rank). The tests come from scipy.stats and the ``krippendorff`` package:

* :func:`bootstrap_interval`: the mean's percentile bootstrap interval (``scipy.stats.bootstrap``, seeded);
* :func:`friedman`: the Friedman test over per-image ranks (``scipy.stats.friedmanchisquare``;
  the Wilcoxon signed-rank test for two methods);
* :func:`nemenyi_cd`: the Nemenyi critical difference of mean ranks (Demšar 2006), from
  ``scipy.stats.studentized_range``;
* :func:`prob_first`: how often each method has the best mean when the images are resampled;
* :func:`rank_alpha`: Krippendorff's alpha (ordinal) with each image a rater of the methods
  (Tomsett et al. 2020's inter-rater reliability); :func:`split_half`: the Spearman correlation of
  the mean ranks of two random halves of the images, with the Spearman-Brown correction.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

__all__ = [
    "bootstrap_interval",
    "complete_rows",
    "friedman",
    "image_ranks",
    "nemenyi_cd",
    "prob_first",
    "rank_alpha",
    "rank_correlation",
    "split_half",
]


def complete_rows(scores: np.ndarray) -> np.ndarray:
    """The rows of ``scores`` [N, K] with no NaN.

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import complete_rows
        >>> complete_rows(np.array([[1.0, 2.0], [np.nan, 1.0]])).tolist()
        [[1.0, 2.0]]
    """
    return scores[~np.isnan(scores).any(axis=1)]


def image_ranks(scores: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Per-image ranks [N, K]: 1 for the best method, ties averaged (``scipy.stats.rankdata``).

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import image_ranks
        >>> image_ranks(np.array([[0.2, 0.9, 0.9]]), higher_is_better=True).tolist()
        [[3.0, 1.5, 1.5]]
    """
    oriented = -scores if higher_is_better else scores
    return stats.rankdata(oriented, axis=1)


def bootstrap_interval(values: np.ndarray, seed: int, level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values`` [N] (NaN dropped; seeded).

    A single value (or none) gives ``(mean, mean)`` (or NaN): there is nothing to resample.

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import bootstrap_interval
        >>> low, high = bootstrap_interval(np.array([1.0, 2.0, 3.0, 4.0]), seed=0)
        >>> bool(low <= 2.5 <= high), bootstrap_interval(np.array([2.0, 2.0]), seed=0)
        (True, (2.0, 2.0))
    """
    values = values[~np.isnan(values)]
    if values.size == 0:
        return math.nan, math.nan
    if values.size == 1 or np.all(values == values[0]):
        return float(values[0]), float(values[0])
    res = stats.bootstrap(
        (values,), np.mean, confidence_level=level, n_resamples=resamples, method="percentile",
        random_state=np.random.default_rng(seed), vectorized=True,
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def friedman(scores: np.ndarray) -> tuple[float, float]:
    """Friedman's chi-square and its p-value over the images (rows) for K >= 3 methods (columns).

    ``scipy.stats.friedmanchisquare`` with its tie correction; for two methods the Wilcoxon
    signed-rank test (``scipy.stats.wilcoxon``: its statistic and p-value). NaN when it cannot be
    computed (one method, fewer than 2 images, or every image ties every method).

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import friedman
        >>> chi2, p = friedman(np.array([[1.0, 2.0, 3.0]] * 4))
        >>> round(chi2, 3), round(p, 4)
        (8.0, 0.0183)
    """
    n, k = scores.shape
    if k == 2 and n >= 2:  # two methods: the Wilcoxon signed-rank test, Friedman's two-sample case
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                res = stats.wilcoxon(scores[:, 0], scores[:, 1])
            except ValueError:  # every difference is zero
                return math.nan, math.nan
        return float(res.statistic), float(res.pvalue)
    if k < 3 or n < 2:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            chi2, p = stats.friedmanchisquare(*scores.T)
        except (ValueError, ZeroDivisionError):
            return math.nan, math.nan
    return float(chi2), float(p)


def nemenyi_cd(k: int, n: int, alpha: float = 0.05) -> float:
    """The Nemenyi critical difference of mean ranks for ``k`` methods on ``n`` images (Demšar 2006).

    ``q_alpha * sqrt(k (k + 1) / (6 n))`` with ``q_alpha`` the studentized range quantile over
    ``sqrt(2)``; two methods whose mean ranks differ by more are different at level ``alpha``.

    Example:
        >>> from camkit.evaluation.stats import nemenyi_cd
        >>> round(nemenyi_cd(3, 5), 3)
        1.482
    """
    if k < 2 or n < 1:
        return math.nan
    q = float(stats.studentized_range.ppf(1 - alpha, k, np.inf)) / math.sqrt(2)
    return q * math.sqrt(k * (k + 1) / (6 * n))


def prob_first(scores: np.ndarray, higher_is_better: bool, seed: int, resamples: int = 2000) -> np.ndarray:
    """How often each method (column) has the best mean over images resampled with replacement: [K].

    A tie for the best mean shares the win. Seeded (numpy ``default_rng(seed)``).

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import prob_first
        >>> prob_first(np.array([[0.9, 0.1], [0.8, 0.2]]), True, seed=0).tolist()
        [1.0, 0.0]
    """
    n, k = scores.shape
    if n == 0:
        return np.full(k, math.nan)
    rng = np.random.default_rng(seed)
    oriented = scores if higher_is_better else -scores
    wins = np.zeros(k)
    done = 0
    while done < resamples:
        m = min(256, resamples - done)
        means = oriented[rng.integers(0, n, size=(m, n))].mean(axis=1)  # [m, K]
        best = means == means.max(axis=1, keepdims=True)
        wins += (best / best.sum(axis=1, keepdims=True)).sum(axis=0)
        done += m
    return wins / resamples


def rank_alpha(ranks: np.ndarray) -> float:
    """Krippendorff's alpha (ordinal) of per-image ranks [N, K]: each image a rater of the K methods.

    1 when every image ranks the methods the same way, near 0 when the order is chance. NaN when
    undefined (one image, or no variation at all).

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import rank_alpha
        >>> rank_alpha(np.array([[1.0, 2.0, 3.0]] * 3))
        1.0
    """
    import krippendorff

    if ranks.shape[0] < 2 or ranks.shape[1] < 2 or np.unique(ranks).size < 2:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return float(krippendorff.alpha(reliability_data=ranks, level_of_measurement="ordinal"))
        except (ValueError, ZeroDivisionError):
            return math.nan


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's correlation of two vectors (NaN when either is constant).

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import rank_correlation
        >>> rank_correlation(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]))
        -1.0
    """
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan
    return float(stats.spearmanr(a, b).statistic)


def split_half(ranks: np.ndarray, seed: int) -> tuple[float, float]:
    """Split-half agreement of per-image ranks [N, K]: ``(rho, spearman_brown)``.

    The images are shuffled (seeded) and halved; ``rho`` is Spearman's correlation between the
    two halves' mean ranks of the methods, ``spearman_brown`` its correction to the full length
    ``2 rho / (1 + rho)``. NaN with fewer than 4 images.

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.stats import split_half
        >>> split_half(np.array([[1.0, 2.0, 3.0]] * 4), seed=0)
        (1.0, 1.0)
    """
    n = ranks.shape[0]
    if n < 4:
        return math.nan, math.nan
    order = np.random.default_rng(seed).permutation(n)
    first, second = ranks[order[: n // 2]].mean(axis=0), ranks[order[n // 2 :]].mean(axis=0)
    rho = rank_correlation(first, second)
    if math.isnan(rho):
        return math.nan, math.nan
    return rho, 2 * rho / (1 + rho) if rho > -1 else -1.0
