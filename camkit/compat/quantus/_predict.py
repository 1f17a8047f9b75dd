"""Quantus's ``model_predict_kwargs``: keywords for the model's forward when a metric scores inputs."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

__all__ = ["PredictKwargs"]


class PredictKwargs(nn.Module):
    """``model(x, **kwargs)``: Quantus's ``model_predict_kwargs``, passed to every forward that scores inputs."""

    def __init__(self, model: nn.Module, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.kwargs = dict(kwargs)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.model(x, **self.kwargs)
        return out
