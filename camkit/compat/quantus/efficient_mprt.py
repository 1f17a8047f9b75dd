"""Quantus 0.6.0's ``EfficientMPRT`` on :func:`camkit.metrics.efficient_mprt`: bins, complexity and extra scores.

Layers are randomised as in :mod:`.randomisation` (Quantus's order and seeds, on a copy of the model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import metrics
from camkit.errors import InvalidInputError
from camkit.metrics.randomisation import discrete_entropy

from ._base import Result, is_default
from ._calls import complexity_measure
from ._predict import with_kwargs
from .localisation import rows
from .randomisation import _Randomisation, quantus_layers, quantus_randomizer

__all__ = ["EfficientMPRT", "bins_by_rule"]

_BIN_RULES = ("Freedman Diaconis", "Scotts", "Square Root", "Sturges Formula", "Rice")


def bins_by_rule(maps: np.ndarray, rule: str, low: int = 10, high: int = 200) -> int:
    """Histogram bins for every map of ``maps`` [B, ...] by a textbook rule, clamped to ``[low, high]``.

    ``n`` is the number of values in one map (the observations of one histogram); the spread
    (interquartile range, standard deviation, min and max) is taken over the whole batch, one
    count of bins for all maps, as Quantus takes it. Rules: Freedman-Diaconis (width
    ``2 IQR / n^(1/3)``, at least 1e-6), Scott (width ``3.5 std / n^(1/3)``), square root
    (``sqrt n``), Sturges (``log2 n + 1``), Rice (``2 n^(1/3)``); counts are truncated to ints.
    """
    values = np.asarray(maps, dtype=np.float64)
    n = values[0].size
    span = float(values.max() - values.min())
    if rule == "Freedman Diaconis":
        width = max(2 * float(np.percentile(values, 75) - np.percentile(values, 25)) / n ** (1 / 3), 1e-6)
        count = int(span / width)
    elif rule == "Scotts":
        width = 3.5 * float(values.std()) / n ** (1 / 3)
        count = int(span / width) if width > 0 else low
    elif rule == "Square Root":
        count = int(np.sqrt(n))
    elif rule == "Sturges Formula":
        count = int(np.log2(n) + 1)
    elif rule == "Rice":
        count = int(2 * n ** (1 / 3))
    else:
        raise InvalidInputError(f"complexity_func_kwargs['rule'] must be one of {list(_BIN_RULES)}, got {rule!r}")
    return max(min(count, high), low)


def _prediction_entropy(model: nn.Module, x: Tensor, softmax: bool) -> Tensor:
    """Shannon entropy (nats) of each output row of ``model(x)`` read as a distribution (divided by its sum of |.|)."""
    with torch.no_grad():
        out = model(x).double()
    out = out.softmax(dim=1) if softmax else out
    if (out < 0).any():
        raise InvalidInputError("compute_extra_scores needs non-negative outputs for their entropy: keep softmax=True")
    p = out / out.abs().sum(dim=1, keepdim=True)
    return -(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(dim=1)


def _ratio(b: Tensor, a: Tensor) -> Tensor:
    return torch.where(a != 0, b / torch.where(a != 0, a, torch.ones_like(a)), torch.full_like(b, float("nan")))


class EfficientMPRT(_Randomisation):
    """Quantus's ``EfficientMPRT`` on :func:`camkit.metrics.efficient_mprt`.

    ``(H(e_random) - H(e)) / H(e)`` per sample, ``H`` the entropy of a histogram of each map's
    values, ``e`` the original model's maps and ``e_random`` those with every layer reset
    (bottom-up). The bins: ``complexity_func_kwargs={"n_bins": ...}``, or a rule
    (``{"rule": "Freedman Diaconis"}``, ``"Scotts"``, ``"Square Root"``, ``"Sturges Formula"``,
    ``"Rice"``, clamped to ``min_n_bins``..``max_n_bins``, 10..200) computed from ``a_batch`` as
    given (or, without it, from each batch's explained maps), or ``n_bins_default`` (100).
    Equal to Quantus with ``n_bins`` or without a rule. Differs with a rule: Quantus counts the
    observations ``n`` as the number of axes of one map (3 for [1, H, W]), so its square root,
    Sturges and Rice rules always give their minimum and its Freedman-Diaconis and Scott bins are
    too wide by ``(H W / 3)^(1/3)``; camkit counts the map's values (:func:`bins_by_rule`).

    ``compute_extra_scores=True`` fills ``scores_extra`` as Quantus does: the explanation
    entropies' delta and fraction (randomised over original), the model outputs' entropies'
    (softmax) delta and fraction, their ratio (``scores_delta_explanation_vs_models``), the
    mean entropy over the randomised layers and the Spearman correlation, per sample, between
    the model's and the explanation's entropies over the layers. With ``skip_layers=False``
    every layer is explained (one explanation pass per layer); the main score is unchanged.

    A ``complexity_func`` replaces the discrete entropy and is called once per map with numpy
    arrays, ``complexity_func(a=map [1, *S], x=input [C, *S], **complexity_func_kwargs)``, the
    keywords carrying ``n_bins`` (given, or found by the rule as above). Differs in ``x``: Quantus
    passes the first input of the whole ``x_batch`` for every original map and ``None`` for the
    randomised ones, so its own ``entropy`` and ``gini_coeffiient`` (which read ``x.shape``)
    fail there; camkit passes each map's own input, as Quantus's complexity metrics do.
    """

    softmax_default = True

    def __init__(
        self, complexity_func: Any = None, complexity_func_kwargs: dict[str, Any] | None = None,
        similarity_func: Any = None, layer_order: str = "bottom_up", seed: int = 42,
        compute_extra_scores: bool = False, skip_layers: bool = True, abs: bool = False, normalise: bool = False,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        options = dict(complexity_func_kwargs or {})
        self.complexity_func = None if is_default("EfficientMPRT", "complexity_func", complexity_func) else (
            complexity_func)  # fmt: skip
        self.complexity_options = options
        self.rule: str = str(options.get("rule") or "")
        if self.rule and "n_bins" not in options and self.rule not in _BIN_RULES:
            raise InvalidInputError(f"complexity_func_kwargs['rule'] must be one of {list(_BIN_RULES)}, got {self.rule!r}")
        self.fixed_bins = "n_bins" in options or not self.rule
        self.n_bins = int(options.get("n_bins", options.get("n_bins_default", 100)))
        self.bin_limits = (int(options.get("min_n_bins", 10)), int(options.get("max_n_bins", 200)))
        self.similarity_func = similarity_func
        self.layer_order, self.seed = layer_order, seed
        self.compute_extra_scores, self.skip_layers = compute_extra_scores, skip_layers
        self.scores_extra: dict[str, list[float]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        a_batch = kwargs.get("a_batch", args[3] if len(args) > 3 else None)
        self._rule_bins: int | None = None
        if not self.fixed_bins and a_batch is not None:  # Quantus reads the rule off a_batch as given
            self._rule_bins = bins_by_rule(np.asarray(a_batch), self.rule, *self.bin_limits)
        self._extra: list[dict[str, Tensor]] = []
        scores = super().__call__(*args, **kwargs)
        if self.compute_extra_scores:
            self.scores_extra = {k: [float(v) for v in torch.cat([e[k] for e in self._extra]).tolist()]
                                 for k in self._extra[0]} if self._extra else {}  # fmt: skip
        return scores

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        bins = self.n_bins if self.fixed_bins else self._rule_bins
        if bins is None:  # no a_batch: the rule reads this batch's explained maps
            bins = bins_by_rule(self.prepared(self.raw_maps(model, model)(x, y)).cpu().numpy(), self.rule,
                                *self.bin_limits)  # fmt: skip

        def factory(replica: nn.Module) -> Callable[[Tensor, Any], Tensor]:
            raw = self.raw_maps(model, replica)
            return lambda inputs, target: self.prepared(raw(inputs, target))

        layers = quantus_layers(model, self.layer_order)
        if not self.compute_extra_scores and self.complexity_func is None:
            scores = metrics.efficient_mprt(factory, model, x, y, bins=bins, layers=layers,
                                            randomize=quantus_randomizer(self.seed), chunk_size=chunk_size)  # fmt: skip
            return rows(scores)
        return rows(self._with_extras(factory, model, x, y, bins, layers, softmax, chunk_size))

    def _complexity(self, bins: int) -> Callable[[Tensor, Tensor], Tensor]:
        """``f(maps [B, *S], x) -> [B]``: the discrete entropy in ``bins`` bins, or the ``complexity_func`` given."""
        if self.complexity_func is None:
            return lambda maps, x: discrete_entropy(maps, bins)
        return complexity_measure(self.complexity_func, {**self.complexity_options, "n_bins": bins})

    def _with_extras(
        self, factory: Callable[[nn.Module], Any], model: nn.Module, x: Tensor, y: Tensor, bins: int, layers: list[str],
        softmax: bool, chunk_size: int,
    ) -> Tensor:  # fmt: skip
        """The score, with every layer's (or the last layer's) explanation and model entropies kept for the extras."""
        originals: list[Tensor] = []
        models: list[Tensor] = []
        complexity = self._complexity(bins)

        def recording(replica: nn.Module) -> Any:
            if self.compute_extra_scores:
                models.append(_prediction_entropy(with_kwargs(replica, self.predict_kwargs), x, softmax))
            return factory(replica)

        def complexity_of_randomised(a: Tensor, b: Tensor) -> Tensor:
            if not originals:  # mprt's first comparison is its unrandomised self-check: only the original counts
                originals.append(complexity(a, x))
                return torch.full_like(originals[0], float("nan"))
            return complexity(b, x)

        res = metrics.mprt(recording, model, x, y, order="bottom-up", layers=layers,
                           similarity=complexity_of_randomised, last_only=self.skip_layers,
                           randomize=quantus_randomizer(self.seed), chunk_size=chunk_size)  # fmt: skip
        h = torch.cat([originals[0][None], res.similarity.double()]).double()  # [1 + L, B]: original, then layers
        if not self.compute_extra_scores:
            return _ratio(h[-1] - h[0], h[0])
        m = torch.stack([models[0], *models[2:]]).double()  # the calls: original, the self-check copy, the layers
        before, after = h[0], h[-1]
        fraction_e, fraction_m = _ratio(after, before), _ratio(m[-1], m[0])
        def similarity(p: Tensor, q: Tensor) -> Tensor:
            if self.similarity_func is None:
                return metrics.spearman(p[None], q[None])[0].double()
            return torch.as_tensor(float(self.similarity_func(p.cpu().numpy(), q.cpu().numpy())), dtype=torch.float64)

        self._extra.append({
            "scores_delta_explanation": after - before, "scores_fraction_explanation": fraction_e,
            "scores_delta_model": m[-1] - m[0], "scores_fraction_model": fraction_m,
            "scores_delta_explanation_vs_models": _ratio(fraction_e, fraction_m),
            "scores_average_complexity": h[1:].mean(dim=0),
            "scores_correlation_model_vs_explanation_complexity": torch.stack(
                [similarity(m[:, i], h[:, i]).cpu() for i in range(h.shape[1])]).to(h.device),
        })  # fmt: skip
        return _ratio(after - before, before)
