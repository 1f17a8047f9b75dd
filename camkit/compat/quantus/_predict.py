"""How the compat metrics call the caller's model: Quantus's ``model_predict_kwargs`` and tabular inputs."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

__all__ = ["AddAxis", "PredictKwargs", "with_kwargs"]


class PredictKwargs(nn.Module):
    """``model(x, **kwargs)``: Quantus's ``model_predict_kwargs``, passed to every forward that scores inputs."""

    def __init__(self, model: nn.Module, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.kwargs = dict(kwargs)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.model(x, **self.kwargs)
        return out


class AddAxis(nn.Module):
    """A model of ``[B, F]`` inputs seen as taking ``[B, 1, F]``: camkit's metrics want a channel axis."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.model(x[:, 0])
        return out


def with_kwargs(model: nn.Module, kwargs: dict[str, Any]) -> nn.Module:
    """``model`` calling the caller's model with ``kwargs`` (the model itself without any), for the
    metrics that explain with the caller's model and score with the keywords, as Quantus's
    ``PyTorchModel.predict`` does (an :class:`AddAxis` keeps its axis outside the keywords)."""
    if not kwargs:
        return model
    if isinstance(model, AddAxis):
        return AddAxis(PredictKwargs(model.model, kwargs))
    return PredictKwargs(model, kwargs)
