"""captum's interpretable models for Lime (``captum._utils.models``), fitted by camkit.

A model is trained by ``fit(dataloader)`` on batches ``(interpretable inputs [N, M], outputs [N],
weights [N])`` and gives its coefficients with ``representation()`` [1, M], the contract captum's
Lime calls. The Lasso, ridge and least-squares models solve their weighted objectives exactly
(coordinate descent for the Lasso, a pseudo-inverse otherwise, in float64): the ``SkLearn*`` names
give scikit-learn's solutions without scikit-learn, and the ``SGD*`` names the optimum their
stochastic gradient descent approaches (their training options are accepted and not needed).
``SkLearnLinearModel`` with any other scikit-learn estimator fits that estimator.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...functional.regions import weighted_linear_fit
from ._pack import CaptumInputError

__all__ = [
    "LinearModel",
    "Model",
    "SGDLasso",
    "SGDLinearRegression",
    "SGDRidge",
    "SkLearnLasso",
    "SkLearnLinearModel",
    "SkLearnLinearRegression",
    "SkLearnRidge",
    "weighted_lasso_fit",
]


def weighted_lasso_fit(z: Tensor, y: Tensor, weights: Tensor, alpha: float,
                       tol: float = 1e-10, max_iter: int = 10000) -> tuple[Tensor, Tensor]:
    """The weighted Lasso with an intercept, by coordinate descent in float64.

    Minimises ``sum_i w_i (y_i - b - z_i . c)^2 / (2 sum(w)) + alpha |c|_1`` (scikit-learn's
    ``Lasso`` objective with ``sample_weight``).

    Args:
        z: [N, M]; y: [N]; weights: [N] (non-negative); alpha: the L1 penalty (>= 0).

    Returns:
        ``(coef [M], intercept [])``.

    Example:
        >>> import torch
        >>> z = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> coef, b = weighted_lasso_fit(z, z @ torch.tensor([2.0, -1.0]) + 0.5, torch.ones(4), 0.0)
        >>> [round(v, 6) for v in coef.tolist()], round(b.item(), 6)
        ([2.0, -1.0], 0.5)
    """
    if alpha < 0:
        raise CaptumInputError(f"alpha must be >= 0, got {alpha}")
    zd = z.detach().double().cpu().numpy().reshape(z.shape[0], -1)
    yd = y.detach().double().cpu().numpy().reshape(-1)
    w = weights.detach().double().cpu().numpy().reshape(-1)
    w = w / max(float(w.sum()), 1e-300)
    z_mean, y_mean = w @ zd, float(w @ yd)
    columns = np.ascontiguousarray((zd - z_mean).T)  # [M, N]: one centred feature per row
    weighted = columns * w  # [M, N]
    scale = np.einsum("mn,mn->m", weighted, columns)  # [M]
    coef = np.zeros(columns.shape[0])
    residual = yd - y_mean
    features = np.flatnonzero(scale > 0)
    for _ in range(max_iter):  # cyclic sweeps over the features in order, from zero (scikit-learn's path)
        largest = _lasso_sweep(features, columns, weighted, scale, coef, residual, alpha)
        if largest <= tol * max(1.0, float(np.abs(coef).max(initial=0.0))):
            break
    coef_t = torch.from_numpy(coef)
    return coef_t, torch.tensor(y_mean - float(z_mean @ coef), dtype=torch.float64)


def _lasso_sweep(indices: np.ndarray, columns: np.ndarray, weighted: np.ndarray, scale: np.ndarray,
                 coef: np.ndarray, residual: np.ndarray, alpha: float) -> float:
    """One pass of coordinate descent over ``indices``, updating ``coef`` and ``residual`` in place; the largest step."""
    largest = 0.0
    scales, values = scale.tolist(), coef.tolist()  # Python floats: numpy scalar reads cost more than the arithmetic
    for j in indices.tolist():
        old, size = values[j], scales[j]
        rho = float(weighted[j] @ residual) + size * old
        new = max(abs(rho) - alpha, 0.0) * (1.0 if rho > 0 else -1.0) / size
        if new != old:
            residual -= columns[j] * (new - old)
            coef[j] = values[j] = new
            largest = max(largest, abs(new - old))
    return largest


class Model:
    """captum's interface of an interpretable model: ``fit(dataloader)`` and ``representation()``."""

    def fit(self, train_data: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def representation(self) -> Tensor:
        raise NotImplementedError


def _gathered(train_data: Any) -> tuple[Tensor, Tensor, Tensor]:
    """A dataloader's batches ``(x, y[, w])`` joined; weights 1 where none are given."""
    xs, ys, ws = [], [], []
    for batch in train_data:
        x, y = batch[0], batch[1]
        xs.append(x.reshape(x.shape[0], -1))
        ys.append(y.reshape(-1))
        ws.append(batch[2].reshape(-1) if len(batch) > 2 else torch.ones(x.shape[0]))
    return torch.cat(xs), torch.cat(ys), torch.cat(ws)


class LinearModel(nn.Module, Model):
    """A linear model whose weights a ``fit`` sets: ``forward(x) = x @ weight.T + bias``."""

    def __init__(self, train_fn: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.train_fn = train_fn
        self.linear: nn.Linear | None = None

    def _set(self, coef: Tensor, intercept: Tensor) -> None:
        # built in float32 and then converted, so that its (overwritten) initial draws take from torch's
        # generator what captum's take: a seeded run over several examples keeps drawing captum's samples
        self.linear = nn.Linear(coef.numel(), 1).to(coef.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(coef.reshape(1, -1))
            self.linear.bias.copy_(intercept.reshape(1))

    def fit(self, train_data: Any, **kwargs: Any) -> Any:
        if self.train_fn is None:
            raise CaptumInputError("LinearModel without a train_fn: use one of the SkLearn* or SGD* models")
        return self.train_fn(self, train_data, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        if self.linear is None:
            raise CaptumInputError("the model is not fitted yet: call fit first")
        return self.linear(x.to(self.linear.weight.dtype))

    def representation(self) -> Tensor:
        if self.linear is None:
            raise CaptumInputError("the model is not fitted yet: call fit first")
        return self.linear.weight.detach()

    def bias(self) -> Tensor | None:
        return None if self.linear is None else self.linear.bias.detach()


class _Solved(LinearModel):
    """A linear model fitted exactly: the Lasso for ``alpha`` (``l1``), else ridge (``alpha``, 0 for least squares)."""

    l1 = False
    default_alpha = 1.0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.alpha = float(kwargs.pop("alpha", self.default_alpha))
        self.options = kwargs

    def fit(self, train_data: Any, **kwargs: Any) -> dict[str, float]:
        x, y, w = _gathered(train_data)
        if self.l1:
            coef, intercept = weighted_lasso_fit(x, y, w, self.alpha)
        else:
            c, b = weighted_linear_fit(x, y[:, None], w, alpha=self.alpha)
            coef, intercept = c[:, 0], b[0]
        self._set(coef.to(_float(x)), intercept.to(_float(x)))
        return {}


def _float(x: Tensor) -> torch.dtype:
    return x.dtype if x.dtype in (torch.float64, torch.float32) else torch.float32


class SkLearnLasso(_Solved):
    """scikit-learn's ``Lasso(alpha)`` solution with sample weights (computed by camkit)."""

    l1 = True


class SkLearnRidge(_Solved):
    """scikit-learn's ``Ridge(alpha)``: ``sum w (y - b - z.c)^2 + alpha |c|^2`` (computed by camkit)."""


class SkLearnLinearRegression(_Solved):
    """Weighted least squares with an intercept (scikit-learn's ``LinearRegression``, computed by camkit)."""

    default_alpha = 0.0


class SGDLasso(SkLearnLasso):
    """captum's ``SGDLasso``: the weighted Lasso's optimum (``alpha`` 1 by default), solved exactly."""


class SGDRidge(SkLearnRidge):
    """captum's ``SGDRidge``: the weighted ridge optimum, solved exactly."""


class SGDLinearRegression(SkLearnLinearRegression):
    """captum's ``SGDLinearRegression``: weighted least squares, solved exactly."""


class SkLearnLinearModel(LinearModel):
    """Any scikit-learn linear estimator (``"linear_model.ElasticNet"``) fitted on the samples with their weights."""

    def __init__(self, sklearn_module: str, **kwargs: Any) -> None:
        super().__init__()
        self.sklearn_module, self.options = sklearn_module, kwargs

    def fit(self, train_data: Any, **kwargs: Any) -> dict[str, float]:
        try:
            estimator: Any = importlib.import_module("sklearn")
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise CaptumInputError(f"SkLearnLinearModel({self.sklearn_module!r}) needs scikit-learn") from error
        for part in self.sklearn_module.split("."):
            found = getattr(estimator, part, None)
            estimator = found if found is not None else importlib.import_module(f"{estimator.__name__}.{part}")
        x, y, w = _gathered(train_data)
        fitted = estimator(**self.options).fit(x.double().numpy(), y.double().numpy(), sample_weight=w.double().numpy())
        self._set(torch.as_tensor(fitted.coef_, dtype=_float(x)).reshape(-1),
                  torch.as_tensor(fitted.intercept_, dtype=_float(x)).reshape(-1)[:1])
        return {}
