"""Quantus's ``evaluate``: every metric on every method's maps, with failures raised, not printed."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from torch import nn

from camkit import Explainer
from camkit.errors import CamkitError, InvalidInputError

__all__ = ["MetricFailedError", "evaluate"]


class MetricFailedError(CamkitError, RuntimeError):
    """A metric raised inside :func:`evaluate`; the message names the method, the metric and the call."""


def evaluate(
    metrics: Mapping[str, Callable[..., Any]],
    xai_methods: Mapping[str, Any],
    model: nn.Module,
    x_batch: np.ndarray,
    y_batch: np.ndarray,
    s_batch: np.ndarray | None = None,
    agg_func: Callable[[Any], Any] = lambda scores: scores,
    explain_func_kwargs: dict[str, Any] | None = None,
    call_kwargs: Mapping[str, dict[str, Any]] | None = None,
    return_as_df: bool | None = None,
    verbose: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Evaluate methods on metrics as ``quantus.evaluate`` does, returning the same nesting.

    ``xai_methods`` maps a name to precomputed maps (numpy), a Quantus explain function (called
    once with ``explain_func_kwargs`` plus ``method=name``), keyword arguments for ``explain``
    (Quantus's ``{"Saliency": {...}}``; camkit's :func:`~camkit.compat.quantus.explain`) or a
    camkit explainer. The result is
    ``{method: {metric: agg_func(scores)}}`` (one ``call_kwargs`` entry), or
    ``{method: {metric: {call: ...}}}`` (several), or a ``pandas.DataFrame`` with
    ``return_as_df``. Differs from Quantus: a metric that fails raises
    :class:`MetricFailedError` naming the method, the metric and the call (Quantus prints the
    error and leaves that entry out of the results, so a broken metric looks like a missing one).
    ``metrics=None`` or ``xai_methods=None`` returns None with a warning (Quantus prints); empty mappings raise.
    """
    if metrics is None or xai_methods is None:
        missing = "xai_methods" if xai_methods is None else "metrics"
        warnings.warn(f"evaluate was given {missing}=None: nothing to evaluate, None returned", UserWarning, stacklevel=2)
        return None
    if not metrics or not xai_methods:
        raise InvalidInputError("evaluate needs at least one metric and one method")
    calls = dict(call_kwargs) if call_kwargs else {"call_kwargs_empty": {}}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for method, value in xai_methods.items():
        extra = {**(explain_func_kwargs or {}), "method": method}
        explain_func: Any = None
        if isinstance(value, np.ndarray):  # maps given; a metric that explains again uses explain(method=name)
            from .functions.explanation_func import METHODS, explain

            a_batch, explain_func = value, explain if method in METHODS else None
        elif isinstance(value, Explainer):
            a_batch, explain_func, extra = None, value, {}
        elif callable(value) or isinstance(value, Mapping):
            if isinstance(value, Mapping):  # Quantus's {method: explain_func_kwargs}: its explain with those
                from .functions.explanation_func import explain

                extra = {**extra, **value}
                value = explain
            a_batch, explain_func = np.asarray(value(model=model, inputs=x_batch, targets=y_batch, **extra)), value
        else:
            raise InvalidInputError(
                f"xai_methods[{method!r}] must be maps (numpy), an explain function, explain's keyword arguments "
                "(a dict) or a camkit explainer, "
                f"got {type(value).__name__}"
            )
        results[method] = {}
        for name, metric in metrics.items():
            results[method][name] = {}
            for call_name, call in calls.items():
                try:
                    scores = metric(
                        model=model, x_batch=x_batch, y_batch=y_batch, a_batch=a_batch, s_batch=s_batch,
                        explain_func=explain_func, explain_func_kwargs=extra, **call, **kwargs,
                    )  # fmt: skip
                except Exception as error:
                    raise MetricFailedError(
                        f"metric {name!r} failed on method {method!r} (call {call_name!r}): "
                        f"{type(error).__name__}: {error}"
                    ) from error
                results[method][name][call_name] = agg_func(scores)
    if len(calls) > 1:
        return results
    ordered = {method: {name: next(iter(per.values())) for name, per in row.items()} for method, row in results.items()}
    if return_as_df:
        import pandas as pd

        return pd.DataFrame.from_dict(ordered)
    return ordered
