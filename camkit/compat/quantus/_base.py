"""Quantus 0.6.0's ``Metric`` on camkit's native metrics.

A compat metric takes Quantus's constructor arguments and call, converts the numpy batches to
tensors, and hands each batch of ``batch_size`` samples to a native function of
:mod:`camkit.metrics`; it returns what Quantus returns (a list with one entry per sample, or
``[aggregate]``). Subclasses set :attr:`Metric.softmax_default` (Quantus's per-metric default)
and implement :meth:`Metric.evaluate`. Where the result differs from Quantus's the class
docstring says so; the differences shared by all metrics:

* ``normalise=True`` divides each sample's map by its own largest ``|a|`` (Quantus divides by
  the largest of the whole batch, so a sample's score depends on its batch-mates). Passing a
  ``normalise_func`` keeps Quantus's behaviour: it gets the whole batch, as in Quantus.
* ``perturb_baseline="black"``/``"white"``/``"mean"`` keep Quantus's meaning here (each
  sample's minimum, maximum, mean over all its values); camkit's native metrics default to 0.0.
* Draws come from numpy's global generator in Quantus's order, so ``np.random.seed`` gives
  Quantus's draws; the native functions take a ``torch.Generator`` or the drawn plan.
* The model is run in eval mode without gradients and every module's flag is restored
  (Quantus leaves the model in eval mode); the model is never moved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import Explainer
from camkit.errors import InvalidInputError

from ._perturbation import NumpyPerturbation, bind_perturb_func
from ._predict import AddAxis, PredictKwargs

__all__ = ["DEFAULTS", "AddAxis", "Metric", "is_default", "model_dtype", "quantus_baseline", "quantus_similarity"]

#: Quantus 0.6.0's default functions, by metric and keyword: passing one is the same as leaving it unset
DEFAULTS: dict[str, dict[str, str]] = {
    **{name: {"perturb_func": "batch_baseline_replacement_by_indices"} for name in (
        "Completeness", "NonSensitivity", "FaithfulnessEstimate", "SensitivityN", "MonotonicityCorrelation",
        "RegionPerturbation", "PixelFlipping", "Monotonicity", "FaithfulnessCorrelation", "Infidelity", "Selectivity",
    )},
    "IROF": {"perturb_func": "baseline_replacement_by_mask"},
    "ROAD": {"perturb_func": "noisy_linear_imputation"},
    "InputInvariance": {"perturb_func": "baseline_replacement_by_shift"},
    "Continuity": {"perturb_func": "batched_translation"},
    "LocalLipschitzEstimate": {"perturb_func": "batch_gaussian_noise", "similarity_func": "lipschitz_constant",
                               "norm_numerator": "distance_euclidean", "norm_denominator": "distance_euclidean"},
    **{name: {"perturb_func": "batch_uniform_noise", "similarity_func": "difference", "norm_numerator": "fro_norm",
              "norm_denominator": "fro_norm"} for name in ("MaxSensitivity", "AvgSensitivity")},
    **{name: {"perturb_func": "batch_uniform_noise"} for name in (
        "RelativeInputStability", "RelativeOutputStability", "RelativeRepresentationStability",
    )},
    **{name: {"similarity_func": "correlation_spearman"} for name in ("MPRT", "SmoothMPRT", "EfficientMPRT")},
    "RandomLogit": {"similarity_func": "ssim"},
}  # fmt: skip
for _name, _extra in {"FaithfulnessEstimate": "correlation_pearson", "SensitivityN": "correlation_pearson",
                      "FaithfulnessCorrelation": "correlation_pearson", "MonotonicityCorrelation": "correlation_spearman"}.items():
    DEFAULTS[_name]["similarity_func"] = _extra
DEFAULTS["Infidelity"]["loss_func"] = "mse"
DEFAULTS["Consistency"] = {"discretise_func": "top_n_sign"}
DEFAULTS["EfficientMPRT"]["complexity_func"] = "discrete_entropy"


def is_default(metric: str, keyword: str, value: Any) -> bool:
    """Whether ``value`` is None or Quantus's default function for ``keyword`` of ``metric`` (by name).

    Example:
        >>> from camkit.compat.quantus.functions.perturb_func import batch_baseline_replacement_by_indices
        >>> is_default("PixelFlipping", "perturb_func", batch_baseline_replacement_by_indices)
        True
    """
    return value is None or DEFAULTS.get(metric, {}).get(keyword) == getattr(value, "__name__", 0)

Result = list[Any]


def quantus_baseline(value: Any) -> Any:
    """A Quantus ``perturb_baseline`` as a camkit :data:`camkit.metrics.Baseline`.

    Numbers stay numbers; ``"black"``, ``"white"`` and ``"mean"`` become each sample's minimum,
    maximum and mean over all its values (channels included), as Quantus computes them.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return float(value)
    reducers: dict[str, Callable[[Tensor], Tensor]] = {
        "black": lambda t: t.amin(dim=1, keepdim=True),
        "white": lambda t: t.amax(dim=1, keepdim=True),
        "mean": lambda t: t.mean(dim=1, keepdim=True),
    }
    if isinstance(value, str) and value.lower() in reducers:
        reduce = reducers[value.lower()]

        def per_sample(x: Tensor) -> Tensor:
            return reduce(x.flatten(1)).view(-1, *(1,) * (x.dim() - 1)).expand_as(x)

        return per_sample
    raise InvalidInputError(
        f"perturb_baseline {value!r} is not supported by camkit.compat.quantus; use a number, 'black', "
        "'white' or 'mean', or call the camkit.metrics function with any camkit baseline"
    )


def quantus_similarity(func: Callable[..., Any], *, keywords: bool = False) -> Callable[[Tensor, Tensor], Tensor]:
    """A Quantus similarity function as ``f(a, b) -> [B]`` on tensors, called as Quantus calls it.

    Quantus flattens each sample's values to a row and calls ``func(rows_a, rows_b, batched=True)``
    (``func(a=rows_a, b=rows_b, batched=True)`` with ``keywords=True``) on numpy arrays.

    Example:
        >>> import torch
        >>> from camkit.compat.quantus.functions.similarity_func import correlation_spearman
        >>> f = quantus_similarity(correlation_spearman)
        >>> f(torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]), torch.tensor([[[1.0, 5.0], [6.0, 9.0]]])).tolist()
        [1.0]
    """

    def call(a: Tensor, b: Tensor) -> Tensor:
        rows_a = a.detach().reshape(a.shape[0], -1).cpu().double().numpy()
        rows_b = b.detach().reshape(b.shape[0], -1).cpu().double().numpy()
        values = func(a=rows_a, b=rows_b, batched=True) if keywords else func(rows_a, rows_b, batched=True)
        return torch.as_tensor(np.array(values, dtype=np.float64).reshape(a.shape[0]), device=a.device)

    return call


class Metric:
    """Quantus's ``Metric`` base: Quantus's constructor arguments and call on camkit's metrics.

    Args:
        abs: take ``|a|`` of the maps (after normalising, as Quantus does).
        normalise: divide each map by its largest ``|a|`` (per sample; see the module docstring).
        normalise_func, normalise_func_kwargs: Quantus's normalisation callable, applied to the
            whole batch of maps (numpy) instead of camkit's per-sample one.
        perturb_func, perturb_func_kwargs: Quantus's perturbation and its keywords, called as
            Quantus calls them where the class sets :attr:`perturb_default`; elsewhere only the
            class's default (camkit perturbs with its own functions).
        perturb_baseline: Quantus's baseline (a number, ``"black"``, ``"white"``, ``"mean"``, ``"uniform"``).
        return_aggregate, aggregate_func: return ``[aggregate_func(scores)]`` (default ``np.mean``).
        default_plot_func, disable_warnings, display_progressbar: accepted for compatibility.
    """

    softmax_default: bool = False
    #: the order Quantus perturbs the features in when each feature is replaced once (``"descending"``
    #: attribution), so that ``perturb_baseline="uniform"`` (one draw per sample and step) is a baseline tensor
    uniform_order: str | None = None
    #: Quantus's default perturbation of the class, set where the class takes any ``perturb_func``
    #: (called through the native metric's ``perturb`` hook); ``uniform_order = "function"``: ``"uniform"``
    #: goes through it too, drawn by the function as Quantus draws it
    perturb_default: Callable[..., Any] | None = None
    #: True: ``model_predict_kwargs`` go to the forward of the model :meth:`evaluate` gets (it only scores
    #: inputs, as Quantus's ``PyTorchModel.predict``); False: the caller's model, the keywords in
    #: :attr:`predict_kwargs` for the class to use where Quantus predicts (nowhere for some, as in Quantus)
    takes_predict_kwargs: bool = False

    def __init__(
        self,
        abs: bool = False,
        normalise: bool = True,
        normalise_func: Callable[..., np.ndarray] | None = None,
        normalise_func_kwargs: dict[str, Any] | None = None,
        perturb_func: Callable[..., Any] | None = None,
        perturb_baseline: Any = "black",
        perturb_func_kwargs: dict[str, Any] | None = None,
        return_aggregate: bool = False,
        aggregate_func: Callable[..., Any] | None = None,
        default_plot_func: Callable[..., Any] | None = None,
        disable_warnings: bool = False,
        display_progressbar: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise TypeError(f"{type(self).__name__} got unknown arguments {sorted(kwargs)}")
        given = dict(perturb_func_kwargs or {})
        self.uniform = self.uniform_order is not None and str(perturb_baseline).lower() == "uniform"
        bounds = dict(given) if self.uniform else {}
        self.uniform_bounds = (float(bounds.pop("uniform_low", 0.0)), float(bounds.pop("uniform_high", 1.0)))
        if self.uniform:
            perturb_func_kwargs = bounds  # what is left over goes to the function below
        #: the caller's perturbation, bound as Quantus binds it (None: the class's own tensor path)
        self.perturb_func: Callable[..., Any] | None = None
        custom = not is_default(type(self).__name__, "perturb_func", perturb_func) or bool(perturb_func_kwargs)
        if self.perturb_default is not None and (custom or (self.uniform_order == "function" and self.uniform)):
            func = perturb_func if perturb_func is not None else self.perturb_default
            self.perturb_func, self.uniform = bind_perturb_func(func, perturb_baseline, given), False
        elif custom:
            raise InvalidInputError(
                f"camkit.compat.quantus computes {type(self).__name__}'s default perturbation "
                f"({DEFAULTS.get(type(self).__name__, {}).get('perturb_func', 'none')}) only, with perturb_baseline "
                f"(a number, 'black', 'white' or 'mean'); got perturb_func={getattr(perturb_func, '__name__', perturb_func)!r}, "
                f"perturb_func_kwargs={perturb_func_kwargs!r}"
            )
        self.abs = abs
        self.normalise = normalise
        if normalise_func is not None and normalise_func_kwargs:
            normalise_func = functools.partial(normalise_func, **normalise_func_kwargs)
        self.normalise_func = normalise_func
        self.perturb_baseline = perturb_baseline
        self.baseline = 0.0 if self.uniform or self.perturb_func is not None else quantus_baseline(perturb_baseline)
        self.return_aggregate = return_aggregate
        self.aggregate_func = aggregate_func if aggregate_func is not None else np.mean
        self.default_plot_func = default_plot_func
        self.disable_warnings = disable_warnings
        self.display_progressbar = display_progressbar
        self.evaluation_scores: Result = []
        self.all_evaluation_scores: Result = []
        self.explain_func: Any = None
        self.explain_func_kwargs: dict[str, Any] = {}
        self.predict_kwargs: dict[str, Any] = {}

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        """Score one batch: x [B, C, *S], y [B], maps a [B, C, *S] (channel-first, on x's device)."""
        raise NotImplementedError

    def __call__(
        self,
        model: nn.Module | None,
        x_batch: np.ndarray,
        y_batch: np.ndarray,
        a_batch: np.ndarray | None = None,
        s_batch: np.ndarray | None = None,
        channel_first: bool | None = None,
        explain_func: Callable[..., Any] | Explainer | None = None,
        explain_func_kwargs: dict[str, Any] | None = None,
        model_predict_kwargs: dict[str, Any] | None = None,
        softmax: bool | None = None,
        device: str | torch.device | None = None,
        batch_size: int = 64,
        custom_batch: Any = None,
        **kwargs: Any,
    ) -> Result:
        """Evaluate as Quantus's ``metric(model=, x_batch=, y_batch=, a_batch=, ...)`` does.

        ``explain_func`` is Quantus's ``f(model=, inputs=, targets=, **explain_func_kwargs) ->
        numpy`` or, the natural alternative, a camkit explainer (``camkit.GradCAM(model)``), which
        is called on tensors. Maps are computed per batch of ``batch_size`` when ``a_batch`` is None.
        """
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unknown arguments {sorted(kwargs)}")
        explain_model, self.predict_kwargs = model, dict(model_predict_kwargs or {})
        if model_predict_kwargs and self.takes_predict_kwargs and model is not None:
            model = PredictKwargs(model, model_predict_kwargs)
        x_all = np.asarray(x_batch)
        self._tabular = x_all.ndim == 2  # Quantus's [B, F] features: seen as [B, 1, F], the model as AddAxis
        if self._tabular:
            x_all, channel_first = x_all[:, None], True
            model = AddAxis(model) if model is not None else None
            explain_model = AddAxis(explain_model) if explain_model is not None else None
        if x_all.ndim < 3:
            raise InvalidInputError(f"x_batch must be [B, F] or [B, C, *S] with 1 to 3 spatial axes, got shape {x_all.shape}")
        if channel_first is None:
            channel_first = _infer_channel_first(x_all.shape)
        if not channel_first:
            x_all = np.moveaxis(x_all, -1, 1)
        y_all = np.asarray(y_batch).reshape(-1)
        if y_all.shape[0] != x_all.shape[0]:
            raise InvalidInputError(f"y_batch has {y_all.shape[0]} labels for {x_all.shape[0]} inputs")
        if a_batch is None and explain_func is None:
            raise InvalidInputError("pass a_batch (the maps) or explain_func (a camkit explainer or Quantus's callable)")
        self.explain_func = explain_func
        self.explain_func_kwargs = dict(explain_func_kwargs or {})
        target_device = torch.device(device) if device is not None else _model_device(model)
        softmax = self.softmax_default if softmax is None else softmax
        scores: Result = []
        for start in range(0, x_all.shape[0], batch_size):
            stop = min(start + batch_size, x_all.shape[0])
            x = torch.as_tensor(np.ascontiguousarray(x_all[start:stop]), dtype=model_dtype(model), device=target_device)
            y = torch.as_tensor(y_all[start:stop], dtype=torch.long, device=target_device)
            if a_batch is not None:
                maps = np.asarray(a_batch)[start:stop]
                a = _as_maps(maps, x, channel_first, self.map_dtype(maps, x))
            else:
                a = self._explain(explain_model, x, y, explain_func, explain_func_kwargs or {})
            s = None if s_batch is None else _as_maps(np.asarray(s_batch)[start:stop], x, channel_first)
            a = self._preprocess(a)
            if model is None and self._needs_model():
                raise InvalidInputError(f"{type(self).__name__} needs the model; got model=None")
            scores.extend(self.evaluate(model, x, y, a, s, softmax=softmax, chunk_size=batch_size))  # type: ignore[arg-type]
        scores = self.combine(scores)
        if self.return_aggregate:
            scores = [self.aggregate_func(scores)]
        self.evaluation_scores = scores
        self.all_evaluation_scores.extend(scores)
        return scores

    def map_dtype(self, a: np.ndarray, x: Tensor) -> torch.dtype:
        """The dtype the given maps are scored in: the inputs' (the model's)."""
        return x.dtype

    def batch_baseline(self, x: Tensor, a: Tensor, step: int) -> Any:
        """The baseline for this batch: :attr:`baseline`, or Quantus's per-step uniform draws as a tensor like ``x``.

        With ``"uniform"`` Quantus draws one value per sample (``np.random.uniform(low, high, B)``) at
        each step and writes it into that step's ``step`` features, taken in order of decreasing
        attribution (``np.argsort(-a)``); each feature is written once, so the values form one tensor.
        """
        if not self.uniform:
            return self.baseline
        flat = a.expand_as(x).flatten(1).cpu().numpy()
        batch, count = flat.shape[0], -(-flat.shape[1] // step)
        order = np.argsort(-flat, axis=1)
        draws = np.random.uniform(*self.uniform_bounds, size=(count, batch))  # one call of size B per step
        values = np.empty(flat.shape)
        values[np.arange(batch)[:, None], order] = draws.T[:, np.arange(flat.shape[1]) // step]
        return torch.as_tensor(values, dtype=x.dtype, device=x.device).view_as(x)

    def perturb_hook(self, a: Tensor | None = None, descending: bool | None = None) -> NumpyPerturbation | None:
        """The caller's ``perturb_func`` as the native ``perturb`` hook (None without one); ``a`` and
        ``descending``: the maps the native metric sorts, so that ties are taken in Quantus's order."""
        if self.perturb_func is None:
            return None
        return NumpyPerturbation(self.perturb_func, a, descending)

    def sample_uniform(self, x: Tensor) -> Tensor:
        """Quantus's ``"uniform"`` over a whole input: one draw per sample from numpy's global generator, like ``x``."""
        draws = np.random.uniform(*self.uniform_bounds, size=x.shape[0])
        return torch.as_tensor(draws, dtype=x.dtype, device=x.device).view(-1, *(1,) * (x.dim() - 1)).expand_as(x)

    def similarity_rows(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        """The ``similarity_func`` given, called by keyword as Quantus's faithfulness metrics call it (None: the default)."""
        func = getattr(self, "similarity_func", None)
        return None if func is None else quantus_similarity(func, keywords=True)

    def combine(self, scores: Result) -> Result:
        """The scores of all batches, one entry per sample, before aggregation (subclasses may merge them)."""
        return scores

    def _needs_model(self) -> bool:
        return True

    def _explain(
        self, model: nn.Module | None, x: Tensor, y: Tensor, explain_func: Any, kwargs: dict[str, Any]
    ) -> Tensor:
        if isinstance(explain_func, Explainer):
            maps = explain_func(x, y)
            return maps[:, None]
        if getattr(self, "_tabular", False):  # the caller's model and [B, F] inputs, as Quantus passes them
            inputs, model = x[:, 0].cpu().numpy(), model.model if isinstance(model, AddAxis) else model
        else:
            inputs = x.cpu().numpy()
        out = explain_func(model=model, inputs=inputs, targets=y.cpu().numpy(), **kwargs)
        return _as_maps(np.asarray(out), x, True)

    def _preprocess(self, a: Tensor) -> Tensor:
        if self.normalise:
            if self.normalise_func is not None:
                a = torch.as_tensor(np.asarray(self.normalise_func(a.cpu().numpy())), device=a.device, dtype=a.dtype)
            else:
                peak = a.abs().flatten(1).amax(dim=1).view(-1, *(1,) * (a.dim() - 1))
                a = torch.where(peak > 0, a / torch.where(peak > 0, peak, torch.ones_like(peak)), a)
        if self.abs:
            a = a.abs()
        return a


def _infer_channel_first(shape: tuple[int, ...]) -> bool:
    """Quantus's rule: channels are the smaller of axis 1 and the last axis."""
    if shape[1] == shape[-1]:
        raise InvalidInputError(
            f"cannot tell whether x_batch {list(shape)} is channel-first or channel-last; pass channel_first"
        )
    return shape[1] < shape[-1]


def model_dtype(model: nn.Module | None) -> torch.dtype:
    """The dtype the inputs are given to ``model`` in: its first floating parameter's (or buffer's), else float32.

    Quantus casts every input to float32 (``torch.Tensor(x)``), so a float64 model raises there.
    """
    if model is not None:
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
    return torch.float32


def _model_device(model: nn.Module | None) -> torch.device:
    if model is not None:
        for tensor in model.parameters():
            return tensor.device
    return torch.device("cpu")


def _as_maps(a: np.ndarray, x: Tensor, channel_first: bool, dtype: torch.dtype | None = None) -> Tensor:
    """Maps as a [B, 1 or C, *S] tensor on x's device, in ``dtype`` (default x's; Quantus's layouts, channel axis added)."""
    t = torch.as_tensor(np.ascontiguousarray(a), dtype=dtype or x.dtype, device=x.device)
    if t.dim() == x.dim() and not channel_first and t.shape[-1] in (1, x.shape[1]) and t.shape[1] != x.shape[1]:
        t = t.movedim(-1, 1)
    if t.dim() == x.dim() - 1:
        t = t[:, None]
    if t.dim() != x.dim() or t.shape[0] != x.shape[0] or t.shape[2:] != x.shape[2:] or t.shape[1] not in (1, x.shape[1]):
        raise InvalidInputError(
            f"maps {list(t.shape)} do not match the inputs {list(x.shape)}: expected {[x.shape[0], *x.shape[2:]]}, "
            f"{[x.shape[0], 1, *x.shape[2:]]} or {list(x.shape)}"
        )
    return t
