"""Quantus 0.6.0's randomisation metrics on :mod:`camkit.metrics` (mprt, random_logit; ``EfficientMPRT`` in its own module).

Layers are randomised as Quantus randomises them, on a copy of the model: every module with a
``reset_parameters`` method, in ``named_modules`` order (reversed for ``"top_down"``), reset
under ``torch.manual_seed(seed + 1)``; camkit does this inside ``torch.random.fork_rng`` so the
caller's global generator is left as it was (Quantus reseeds it). ``explain_func`` is Quantus's
callable or a camkit explainer, rebuilt on each randomised copy. Maps keep their channel axis
([B, C, *S]): maps with several channels are compared whole, as Quantus compares them (flattened).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import Explainer, metrics
from camkit.errors import InvalidInputError

from ._base import Metric, Result, quantus_similarity
from .localisation import rows

__all__ = ["MPRT", "RandomLogit", "SmoothMPRT"]

_ORDERS = {"top_down": "top-down", "bottom_up": "bottom-up", "independent": "independent"}


def quantus_layers(model: nn.Module, order: str) -> list[str]:
    """Quantus's randomisation order: modules with ``reset_parameters``, reversed for top-down."""
    names = [name for name, module in model.named_modules() if hasattr(module, "reset_parameters")]
    return names[::-1] if order == "top_down" else names


def quantus_randomizer(seed: int) -> Callable[[nn.Module, torch.Generator], None]:
    """Reset a module's parameters under ``torch.manual_seed(seed + 1)``, the global generator restored after."""

    def randomize(module: nn.Module, generator: torch.Generator) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            module.reset_parameters()  # type: ignore[operator]

    return randomize


def rebind(explainer: Any, model: nn.Module, replica: nn.Module) -> Any:
    """A copy of ``explainer`` whose model (and every module it holds of it) is ``replica``'s."""
    memo: dict[int, Any] = {id(old): new for old, new in zip(model.modules(), replica.modules())}
    memo.update({id(old): new for old, new in zip(model.parameters(), replica.parameters())})
    return copy.deepcopy(explainer, memo)


def second_moment(a: Tensor) -> Tensor:
    """Each map divided by the root of its mean square (Quantus's average second-moment estimate, per sample)."""
    root = a.flatten(1).square().mean(dim=1).sqrt().view(-1, *(1,) * (a.dim() - 1))
    return torch.where(root > 0, a / torch.where(root > 0, root, torch.ones_like(root)), a)


class _Randomisation(Metric):
    """A metric that re-explains: keeps ``explain_func`` for :meth:`factory`."""

    def __call__(self, *args: Any, explain_func: Any = None, explain_func_kwargs: Any = None, **kwargs: Any) -> Any:
        if explain_func is None:
            raise InvalidInputError(
                f"{type(self).__name__} re-explains: pass explain_func (a camkit explainer or Quantus's)"
            )
        self._explain_func, self._explain_kwargs = explain_func, dict(explain_func_kwargs or {})
        kwargs.update(explain_func=explain_func, explain_func_kwargs=explain_func_kwargs)
        return super().__call__(*args, **kwargs)

    def raw_maps(self, model: nn.Module, replica: nn.Module) -> Callable[[Tensor, Any], Tensor]:
        """``f(x, y) -> maps [B, C, *S]`` of ``replica`` (a copy of ``model``), before normalising."""
        explain_func = self._explain_func
        if isinstance(explain_func, Explainer):
            explain_func = rebind(explain_func, model, replica)

        def explain(x: Tensor, y: Any) -> Tensor:
            return self._explain(replica, x, torch.as_tensor(y), explain_func, self._explain_kwargs)

        return explain

    def prepared(self, maps: Tensor) -> Tensor:
        """Quantus's normalise and abs, on maps [B, C, *S]."""
        return self._preprocess(maps)


class MPRT(_Randomisation):
    """Quantus's ``MPRT`` on :func:`camkit.metrics.mprt`.

    Returns, as Quantus, ``{"original": [...], layer: [...], ...}`` (per sample, the Spearman
    correlation of ``a_batch`` with the maps of the model randomised up to that layer), or a list
    with ``return_average_correlation`` / ``return_last_correlation``. Per layer equal to
    Quantus. Differs: Quantus's average includes the ``"original"`` entry (it skips a key
    ``"orig"`` that does not exist), an unrandomised self-check near 1 that pulls every average
    up; camkit averages the randomised layers only. A ``similarity_func`` is called as Quantus
    calls it: ``f(rows_a, rows_b, batched=True)`` on the maps flattened to [B, F] numpy rows.
    """

    order_default = "top_down"
    samples = 1

    def __init__(
        self, similarity_func: Any = None, layer_order: str = "top_down", seed: int = 42,
        return_average_correlation: bool = False, return_last_correlation: bool = False, skip_layers: bool = False,
        abs: bool = True, normalise: bool = True, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        if layer_order not in _ORDERS:
            raise InvalidInputError(f"layer_order must be one of {sorted(_ORDERS)}, got {layer_order!r}")
        if return_average_correlation and (return_last_correlation or skip_layers):
            raise InvalidInputError(
                "return_average_correlation needs every layer: leave return_last_correlation and skip_layers False"
            )
        self.similarity_func = similarity_func
        self.layer_order, self.seed = layer_order, seed
        self.return_average_correlation = return_average_correlation
        self.return_last_correlation = return_last_correlation
        self.skip_layers = skip_layers

    def given_maps(self, a: Tensor) -> Tensor | None:
        return a

    def similarity(self, a: Tensor, b: Tensor) -> Tensor:
        a, b = self.prepared(a), self.prepared(b)
        if self.similarity_func is None:
            return metrics.spearman(a, b)
        return quantus_similarity(self.similarity_func)(a, b).float()

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        res = metrics.mprt(
            lambda replica: self.raw_maps(model, replica), model, x, y, order=_ORDERS[self.layer_order],
            layers=quantus_layers(model, self.layer_order), maps=self.given_maps(a),
            similarity=self.similarity, samples=self.samples, noise_magnitude=getattr(self, "noise_magnitude", 0.1),
            last_only=self.skip_layers, randomize=quantus_randomizer(self.seed),
            generator=torch.Generator().manual_seed(self.seed), chunk_size=chunk_size,
        )  # fmt: skip
        per_layer = {"original": res.original, **dict(zip(res.layers, res.similarity))}
        return [{name: float(values[i]) for name, values in per_layer.items()} for i in range(x.shape[0])]

    def combine(self, scores: Result) -> Any:
        if self.return_last_correlation:
            return [list(sample.values())[-1] for sample in scores]
        if self.return_average_correlation:
            return [float(np.mean([v for k, v in sample.items() if k != "original"])) for sample in scores]
        return {name: [sample[name] for sample in scores] for name in (scores[0] if scores else {})}


class SmoothMPRT(MPRT):
    """Quantus's ``SmoothMPRT`` on :func:`camkit.metrics.mprt` with ``samples=nr_samples``.

    Each map is the mean over ``nr_samples - 1`` noisy copies (std ``noise_magnitude * (max - min)``
    of each input) and the input itself; bottom-up by default; maps normalised by their root
    mean square per sample (Quantus: over the whole batch). Differs: camkit draws the noise once
    from a ``torch.Generator`` seeded with ``seed`` and reuses it for every layer, so a layer's
    score sees the weights change and not new noise; Quantus draws fresh numpy noise for every
    layer. Quantus 0.6.0 also ignores ``explain_func`` here: it explains with
    ``quantus.explain(model, x, y, **explain_func_kwargs)``; camkit calls the ``explain_func``
    given. With ``nr_samples=1`` and ``explain_func=quantus.explain`` equal to Quantus.
    """

    order_default = "bottom_up"

    def __init__(
        self, similarity_func: Any = None, layer_order: str = "bottom_up", seed: int = 42, nr_samples: int = 50,
        noise_magnitude: float = 0.1, normalise_func: Any = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(similarity_func=similarity_func, layer_order=layer_order, seed=seed, **kwargs)
        self.samples, self.noise_magnitude = nr_samples, noise_magnitude
        self.normalise_func = normalise_func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._maps_given = kwargs.get("a_batch") is not None or (len(args) > 3 and args[3] is not None)
        return super().__call__(*args, **kwargs)

    def given_maps(self, a: Tensor) -> Tensor | None:
        # without a_batch, Quantus explains the smoothed original model: so does mprt with maps=None
        return super().given_maps(a) if self._maps_given else None

    def prepared(self, maps: Tensor) -> Tensor:
        if self.normalise and self.normalise_func is None:
            maps = second_moment(maps)
            return maps.abs() if self.abs else maps
        return super().prepared(maps)


class RandomLogit(_Randomisation):
    """Quantus's ``RandomLogit`` on :func:`camkit.metrics.random_logit`.

    The other class is drawn as Quantus draws it (``np.random.seed(seed)`` then ``randint`` per
    batch), so the classes are Quantus's. Differs: Quantus's default similarity is SSIM of the
    *flattened* maps (a 1-D window sliding along the rows joined end to end), with the pair's
    value range; camkit compares the maps on their own grid (:func:`camkit.metrics.ssim`, a 7x7
    window on images) with the pair's value range. A ``similarity_func`` replaces it and is called
    as Quantus calls it: ``f(rows_a, rows_b, batched=True)`` on the maps flattened to [B, F] rows.
    """

    def __init__(
        self, similarity_func: Any = None, num_classes: int = 1000, seed: int = 42, abs: bool = False,
        normalise: bool = True, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.similarity_func, self.num_classes, self.seed = similarity_func, num_classes, seed

    def similarity(self, a: Tensor, b: Tensor) -> Tensor:
        if self.similarity_func is not None:
            return quantus_similarity(self.similarity_func)(a, b).float()
        values = []
        for p, q in zip(a, b):  # the pair's range, as Quantus; each channel on its grid, averaged
            span = float(torch.maximum(p.max(), q.max()) - torch.minimum(p.min(), q.min()))
            values.append(metrics.ssim(p, q, data_range=span if span > 0 else 1.0).mean()[None])
        return torch.cat(values)

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        np.random.seed(self.seed)
        drawn = torch.as_tensor(np.random.randint(0, self.num_classes - 1, x.shape[0]), device=x.device)
        off = drawn + (drawn >= y).long()
        raw = self.raw_maps(model, model)
        scores = metrics.random_logit(
            lambda inputs, target: self.prepared(raw(inputs, target)), model, x, y, num_classes=self.num_classes,
            maps=a, similarity=self.similarity, off_classes=off, chunk_size=chunk_size,
        )  # fmt: skip
        return rows(scores)
