"""Quantus 0.6.0's robustness metrics on :mod:`camkit.metrics`.

The perturbations are drawn from numpy's global generator in Quantus's order (one draw of the
batch's shape per step, batch by batch), so after ``np.random.seed(s)`` the perturbed inputs are
Quantus's; camkit then re-explains all of them in bounded batches. A ``perturb_func`` given to
the noise-based classes is called as Quantus calls it (its keywords, ``perturb_func_kwargs`` over
them; ``arr`` the flattened batch, once per step). Quantus's default norm and similarity
functions are computed in torch; other ones are called as Quantus calls them (numpy rows
[B, F], once per step). Maps keep their channel axis ([B, C, *S]): maps with several channels,
given and re-explained, are compared whole, as Quantus compares them (flattened).
Shared difference: with ``return_nan_when_prediction_changes=True`` Quantus returns NaN for a
sample as soon as one perturbation changes its class; camkit leaves those perturbations out and
returns NaN only when all change it (the relative stabilities of Agarwal et al. 2022 maximise
over the perturbations that keep the class).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import metrics
from camkit.errors import InvalidInputError
from camkit.hooks import HookScope

from ._base import is_default
from ._calls import lipschitz_measure, sensitivity_measure, translations
from ._predict import with_kwargs
from .localisation import rows
from .randomisation import _Randomisation

__all__ = [
    "AvgSensitivity",
    "Consistency",
    "Continuity",
    "LocalLipschitzEstimate",
    "MaxSensitivity",
    "RelativeInputStability",
    "RelativeOutputStability",
    "RelativeRepresentationStability",
]


def _given_functions(name: str, similarity_func: Any, norm_numerator: Any, norm_denominator: Any) -> Any:
    """The three functions as given (None for Quantus's default), or None when all three are the defaults."""
    given = {"similarity_func": similarity_func, "norm_numerator": norm_numerator, "norm_denominator": norm_denominator}
    custom = {key: None if is_default(name, key, value) else value for key, value in given.items()}
    return None if all(value is None for value in custom.values()) else custom


def _numpy_plan(x: Tensor, samples: int, draw: Callable[[tuple[int, ...]], np.ndarray]) -> Tensor:
    """Perturbed inputs [N, B, C, *S]: x plus one numpy draw of shape [B, features] per step, in Quantus's order."""
    flat = x.flatten(1)
    noise = [torch.as_tensor(draw(tuple(flat.shape)), device=x.device) for _ in range(samples)]
    return torch.stack([(flat.double() + n).to(x.dtype).view_as(x) for n in noise])


def _custom(name: str, perturb_func: Any, kwargs: dict[str, Any], given: dict[str, Any] | None) -> Any:
    """Quantus's ``make_perturb_func``: ``perturb_func`` with the metric's keywords, ``perturb_func_kwargs`` over them;
    None for Quantus's default function (drawn by :func:`_numpy_plan`)."""
    if is_default(name, "perturb_func", perturb_func):
        return None
    return functools.partial(perturb_func, **{**kwargs, **(given or {})})


def _perturbed(x: Tensor, samples: int, perturb: Any) -> Tensor:
    """Perturbed inputs [N, B, C, *S] from a Quantus perturbation function, called as Quantus calls it:
    ``perturb(arr=[B, features] numpy, indices=every feature's index per row)``, once per step."""
    flat = x.detach().flatten(1).cpu().numpy()
    indices = np.tile(np.arange(flat.shape[1]), (flat.shape[0], 1))
    steps = [np.asarray(perturb(arr=flat.copy(), indices=indices)) for _ in range(samples)]
    return torch.stack([torch.as_tensor(step, device=x.device).to(x.dtype).reshape(x.shape) for step in steps])


class _Robustness(_Randomisation):
    """A robustness metric: re-explains perturbed inputs with ``explain_func``."""

    perturb: Any = None
    nr_samples = 0

    def explainer(self, model: nn.Module) -> Callable[[Tensor, Any], Tensor]:
        raw = self.raw_maps(model, model)
        return lambda inputs, target: self.prepared(raw(inputs, target))

    def scoring(self, model: nn.Module) -> nn.Module:
        """The model that predicts: ``model_predict_kwargs`` passed to its forward, as Quantus's ``predict`` does
        (the explanations and Quantus's hidden representation run the caller's model without them)."""
        return with_kwargs(model, self.predict_kwargs)

    def plan(self, x: Tensor, draw: Callable[[tuple[int, ...]], np.ndarray]) -> Tensor:
        """The perturbed inputs: Quantus's default draws, or the ``perturb_func`` given, called as Quantus calls it."""
        return (
            _numpy_plan(x, self.nr_samples, draw)
            if self.perturb is None
            else _perturbed(x, self.nr_samples, self.perturb)
        )


class _Sensitivity(_Robustness):
    reduce = "mean"
    softmax_default = False

    def __init__(
        self, similarity_func: Any = None, norm_numerator: Any = None, norm_denominator: Any = None,
        nr_samples: int = 200, perturb_func: Any = None, lower_bound: float = 0.2, upper_bound: float | None = None,
        perturb_func_kwargs: dict[str, Any] | None = None, return_nan_when_prediction_changes: bool = False,
        abs: bool = False, normalise: bool = False, **kwargs: Any,
    ) -> None:  # fmt: skip
        custom = _given_functions(type(self).__name__, similarity_func, norm_numerator, norm_denominator)
        self.measure = None if custom is None else sensitivity_measure(**custom)
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        bounds = {"lower_bound": lower_bound, "upper_bound": upper_bound}
        self.perturb = _custom(type(self).__name__, perturb_func, bounds, perturb_func_kwargs)
        options = {**bounds, **(perturb_func_kwargs or {})}
        low, high = options["lower_bound"], options["upper_bound"]
        self.low, self.high = (-low, low) if high is None else (low, high)
        self.nr_samples = nr_samples
        self.skip_changed = return_nan_when_prediction_changes

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Any:
        plan = self.plan(x, lambda shape: np.random.uniform(self.low, self.high, shape))
        measure = metrics.avg_sensitivity if self.reduce == "mean" else metrics.max_sensitivity
        scores = measure(
            self.explainer(model), x, y, model=self.scoring(model), maps=a, perturbed=plan,
            skip_changed=self.skip_changed, chunk_size=chunk_size, measure=self.measure,
        )  # fmt: skip
        return rows(scores)


class AvgSensitivity(_Sensitivity):
    """Quantus's ``AvgSensitivity`` on :func:`camkit.metrics.avg_sensitivity`.

    ``mean_n ||e(x) - e(x_n)|| / ||e(x)||`` over ``nr_samples`` uniform perturbations
    (``U(-lower_bound, lower_bound)``, or ``U(lower_bound, upper_bound)``). Equal to Quantus on
    the same draws with ``normalise=False`` (Quantus normalises by the batch's maximum, camkit
    per map), and where no perturbation changes the class (see the module docstring).
    """

    reduce = "mean"


class MaxSensitivity(_Sensitivity):
    """Quantus's ``MaxSensitivity`` on :func:`camkit.metrics.max_sensitivity`; as :class:`AvgSensitivity`, with the maximum."""

    reduce = "max"


class LocalLipschitzEstimate(_Robustness):
    """Quantus's ``LocalLipschitzEstimate`` on :func:`camkit.metrics.local_lipschitz_estimate`.

    ``max_n ||e(x) - e(x_n)||_2 / ||x - x_n||_2`` over Gaussian perturbations
    ``N(perturb_mean, perturb_std^2)``. Equal to Quantus on the same draws (``normalise=False``,
    or maps already normalised per sample); Quantus adds 1e-10 to the denominator.
    """

    def __init__(
        self, similarity_func: Any = None, norm_numerator: Any = None, norm_denominator: Any = None,
        nr_samples: int = 200, perturb_func: Any = None, perturb_mean: float = 0.0, perturb_std: float = 0.1,
        perturb_func_kwargs: dict[str, Any] | None = None, return_nan_when_prediction_changes: bool = False,
        abs: bool = False, normalise: bool = True, **kwargs: Any,
    ) -> None:  # fmt: skip
        custom = _given_functions("LocalLipschitzEstimate", similarity_func, norm_numerator, norm_denominator)
        self.measure = None if custom is None else lipschitz_measure(**custom)
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        moments = {"perturb_mean": perturb_mean, "perturb_std": perturb_std}
        self.perturb = _custom("LocalLipschitzEstimate", perturb_func, moments, perturb_func_kwargs)
        options = {**moments, **(perturb_func_kwargs or {})}
        self.mean, self.std = options["perturb_mean"], options["perturb_std"]
        self.nr_samples = nr_samples
        self.skip_changed = return_nan_when_prediction_changes

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Any:
        plan = self.plan(x, lambda shape: np.random.normal(self.mean, self.std, shape))
        scores = metrics.local_lipschitz_estimate(
            self.explainer(model), x, y, model=self.scoring(model), maps=a, perturbed=plan, skip_changed=self.skip_changed,
            chunk_size=chunk_size, measure=self.measure,
        )  # fmt: skip
        return rows(scores)


_FILLS = ("black", "mean", "uniform", "white")


def _check_fill(value: Any) -> None:
    """Refuse a ``perturb_baseline`` that ``batched_translation`` cannot fill with, before any call."""
    if isinstance(value, np.ndarray) or (isinstance(value, (int, float, np.number)) and not isinstance(value, bool)):
        return
    if isinstance(value, str) and value.lower() in _FILLS:
        return
    hint = " (Quantus 0.6.0 removed 'random': use 'uniform', bounds uniform_low/uniform_high in perturb_func_kwargs)"
    raise InvalidInputError(
        f"Continuity's perturb_baseline must be a number or one of {list(_FILLS)}, got {value!r}"
        f"{hint if isinstance(value, str) and value.lower() == 'random' else ''}; a perturb_func of your own may "
        "take other values"
    )


class Continuity(_Robustness):
    """Quantus's ``Continuity`` on :func:`camkit.metrics.continuity`.

    ``max_k ||e(x) - e(x_k)||_1 / ||x - x_k||_2`` over ``nr_steps`` translations along the last
    axis, the gap filled with ``perturb_baseline`` per input (``"black"``: its minimum,
    ``"white"``, ``"mean"``, ``"uniform"``: one draw per input and step from numpy, bounds
    ``uniform_low``/``uniform_high`` in ``perturb_func_kwargs``, or a number). A ``perturb_func``
    replaces Quantus's ``batched_translation`` and is called as that function is:
    ``perturb_func(arr=x [B, C, H, W], perturb_baseline=..., perturb_dx=shift, direction="x",
    **perturb_func_kwargs)`` once per step. As Quantus, the inputs are re-explained (``a_batch``
    is not used). Equal to Quantus on images with ``normalise=False`` and the default
    perturbation. Differs: Quantus 0.6.0 ignores ``perturb_baseline``, ``perturb_func`` and
    ``perturb_func_kwargs`` here (it always translates with ``"black"``); camkit uses them.
    Inputs that are not images ``[B, C, H, W]`` raise ``InvalidInputError`` (a ``ValueError``), as
    Quantus's translation does; :func:`camkit.metrics.continuity` takes signals and volumes too.
    Translations that change nothing are left out (Quantus divides 0 by 1e-9). A
    ``perturb_baseline`` the default translation cannot fill with (``"random"``, which Quantus
    0.6.0 removed, a misspelt name) raises ``InvalidInputError`` at construction; Quantus's
    ``Continuity`` accepts it and translates with ``"black"``.
    """

    def __init__(
        self, nr_steps: int = 28, perturb_func: Any = None, perturb_baseline: str = "black",
        perturb_func_kwargs: dict[str, Any] | None = None, return_nan_when_prediction_changes: bool = False,
        abs: bool = True, normalise: bool = True, **kwargs: Any,
    ) -> None:  # fmt: skip
        number = isinstance(perturb_baseline, (int, float)) and not isinstance(perturb_baseline, bool)
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.nr_steps = nr_steps
        self.fill = float(perturb_baseline) if number else None
        default_func = is_default("Continuity", "perturb_func", perturb_func)
        if default_func:
            _check_fill(perturb_baseline)
        black = isinstance(perturb_baseline, str) and perturb_baseline == "black"
        self.translate = None  # the native translation, unless another function, fill or keyword is given
        if not (default_func and (number or black) and not perturb_func_kwargs):
            self.translate = functools.partial(
                translations, perturb_func=None if default_func else perturb_func, perturb_baseline=perturb_baseline,
                perturb_func_kwargs=perturb_func_kwargs,
            )  # fmt: skip
        self.skip_changed = return_nan_when_prediction_changes

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Any:
        if x.dim() != 4:
            raise InvalidInputError(
                f"Continuity translates images [B, C, H, W] (Quantus's contract), got inputs of shape {list(x.shape)}; "
                "call camkit.metrics.continuity for signals and volumes"
            )
        plan = None if self.translate is None else self.translate(x, self.nr_steps)
        scores = metrics.continuity(
            self.explainer(model), x, y, model=self.scoring(model), steps=self.nr_steps, fill=self.fill, perturbed=plan,
            skip_changed=self.skip_changed, chunk_size=chunk_size,
        )  # fmt: skip
        return rows(scores)


class Consistency(_Robustness):
    """Quantus's ``Consistency`` on :func:`camkit.metrics.consistency`.

    Labels each map by the signs of its first 5 values (Quantus's ``top_n_sign``) or by the
    ``discretise_func`` given, called as Quantus calls it (on each flattened map, numpy), and,
    per sample, scores the share of the other samples with its label that the model puts in its
    class. Equal to Quantus, also for a sample whose label no other sample shares: 0, Quantus's
    convention (0 divided by 1e-9), where :func:`camkit.metrics.consistency` returns NaN (a share of
    no samples). No re-explanation.
    """

    def __init__(self, discretise_func: Any = None, abs: bool = True, normalise: bool = True, **kwargs: Any) -> None:
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.discretise_func = (
            None if is_default("Consistency", "discretise_func", discretise_func) else discretise_func
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return super(_Randomisation, self).__call__(*args, **kwargs)

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Any:
        model = self.scoring(model)
        with torch.no_grad():
            predictions = torch.cat(
                [model(x[i : i + chunk_size]).argmax(dim=1) for i in range(0, x.shape[0], chunk_size)]
            )
        labels = None
        if self.discretise_func is not None:
            hashes = [self.discretise_func(row) for row in a.flatten(1).cpu().numpy()]
            labels = torch.as_tensor(np.unique(np.array(hashes, dtype=object), return_inverse=True)[1], device=x.device)
        shares = metrics.consistency(a.flatten(1), predictions, n=5, labels=labels)
        return rows(torch.nan_to_num(shares, nan=0.0))  # a label no other sample shares: 0, as in Quantus


def _representation(model: nn.Module, names: list[str] | None, indices: list[int] | None) -> Callable[[Tensor], Tensor]:
    """Quantus's hidden representation: the outputs of the chosen hidden modules (every module but the
    model itself and its ``nn.Sequential`` containers), flattened and joined. As in Quantus, an index
    counts over those hidden modules; a negative one counts from their end, as in Python (Quantus
    counts it from the end of every module, the model and containers included, and so misses)."""
    hidden = [(n, m) for n, m in model.named_modules() if not isinstance(m, (type(model), nn.Sequential))]
    wanted_index = {i % len(hidden) for i in (indices or []) if -len(hidden) <= i < len(hidden)}
    chosen = [
        module
        for i, (name, module) in enumerate(hidden)
        if (not names and not indices) or i in wanted_index or name in (names or [])
    ]
    if not chosen:
        raise InvalidInputError(
            f"no hidden module matches layer_names={names!r} / layer_indices={indices!r} "
            f"(indices count over the {len(hidden)} hidden modules)"
        )

    def features(x: Tensor) -> Tensor:
        outputs: list[Tensor] = []
        with HookScope() as hooks:
            for module in chosen:
                hooks.forward(module, lambda m, i, o: outputs.append(o.flatten(1)))
            model(x)
        return torch.cat(outputs, dim=1)

    return features


class _Relative(_Robustness):
    kind = "input"

    def __init__(
        self, nr_samples: int = 200, perturb_func: Any = None, perturb_func_kwargs: dict[str, Any] | None = None,
        eps_min: float = 1e-6, return_nan_when_prediction_changes: bool = True, abs: bool = False,
        normalise: bool = False, normalise_func: Any = None, layer_names: list[str] | None = None,
        layer_indices: list[int] | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        if layer_names is not None and layer_indices is not None:
            raise InvalidInputError("pass layer_names or layer_indices, not both")
        super().__init__(abs=abs, normalise=normalise, normalise_func=normalise_func, **kwargs)
        self.perturb = _custom(type(self).__name__, perturb_func, {"upper_bound": 0.2}, perturb_func_kwargs)
        options = {"lower_bound": 0.02, "upper_bound": 0.2, **(perturb_func_kwargs or {})}
        low, high = options["lower_bound"], options["upper_bound"]
        self.low, self.high = (-low, low) if high is None else (low, high)
        self.nr_samples, self.eps = nr_samples, eps_min
        self.skip_changed = return_nan_when_prediction_changes
        self.layer_names, self.layer_indices = layer_names, layer_indices

    def prepared(self, maps: Tensor) -> Tensor:
        if self.normalise and self.normalise_func is None:
            from .randomisation import second_moment

            maps = second_moment(maps)
            return maps.abs() if self.abs else maps
        return super().prepared(maps)

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Any:
        plan = self.plan(x, lambda shape: np.random.uniform(self.low, self.high, shape))
        common: dict[str, Any] = {
            "maps": self.prepared(a), "perturbed": plan, "eps": self.eps,
            "skip_changed": self.skip_changed, "chunk_size": chunk_size,
        }  # fmt: skip
        explain, scoring = self.explainer(model), self.scoring(model)
        if self.kind == "input":
            scores = metrics.relative_input_stability(explain, scoring, x, y, **common)
        elif self.kind == "output":
            select = (lambda out: out.softmax(dim=1)) if softmax else None
            scores = metrics.relative_output_stability(explain, scoring, x, y, output=select, **common)
        else:
            represent = _representation(model, self.layer_names, self.layer_indices)
            scores = metrics.relative_representation_stability(
                explain, scoring, x, y, representation=represent, **common
            )
        return rows(scores)


class RelativeInputStability(_Relative):
    """Quantus's ``RelativeInputStability`` on :func:`camkit.metrics.relative_input_stability`.

    Perturbations ``U(0.02, 0.2)`` as Quantus draws them (its ``batch_uniform_noise`` with
    ``upper_bound=0.2`` and the default ``lower_bound``: one-sided, every value raised; the
    native function defaults to ``U(-0.2, 0.2)``). Maps normalised by their root mean square per
    sample (Quantus: over the batch). Equal to Quantus where no perturbation changes the class.
    """

    kind = "input"


class RelativeOutputStability(_Relative):
    """Quantus's ``RelativeOutputStability`` on :func:`camkit.metrics.relative_output_stability`; as
    :class:`RelativeInputStability`, the denominator the change of the logits (probabilities with ``softmax=True``)."""

    kind = "output"


class RelativeRepresentationStability(_Relative):
    """Quantus's ``RelativeRepresentationStability`` on :func:`camkit.metrics.relative_representation_stability`.

    The representation is Quantus's: the outputs of the hidden modules (every module but the model
    itself and its ``nn.Sequential`` containers; default all of them) named in ``layer_names`` or
    at ``layer_indices`` among the hidden modules, flattened and joined (a negative index counts
    from their end, as in Python; Quantus counts it over every module). Otherwise as :class:`RelativeInputStability`.
    """

    kind = "representation"
