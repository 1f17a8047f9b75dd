"""captum's ``ModelInputWrapper``: each input of a model passes through an identity layer of its own.

Layer methods can then attribute to a model's inputs by naming those layers
(``wrapped.input_maps["x"]``); the attribution itself is camkit's, as for any layer.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

__all__ = ["InputIdentity", "ModelInputWrapper"]


class InputIdentity(nn.Module):
    """An identity layer standing for the model input ``input_name``."""

    def __init__(self, input_name: str) -> None:
        super().__init__()
        self.input_name = input_name

    def forward(self, x: Any) -> Any:
        return x


class ModelInputWrapper(nn.Module):
    """``module`` with an :class:`InputIdentity` layer in front of each of its forward's arguments."""

    def __init__(self, module_to_wrap: nn.Module) -> None:
        super().__init__()
        self.module = module_to_wrap
        self.arg_name_list = list(inspect.signature(module_to_wrap.forward).parameters)
        self.input_maps = nn.ModuleDict({name: InputIdentity(name) for name in self.arg_name_list})

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        moved = [self.input_maps[name](arg) for name, arg in zip(self.arg_name_list, args)]
        moved += list(args[len(moved) :])
        named = {name: self.input_maps[name](value) if name in self.input_maps else value for name, value in kwargs.items()}
        return self.module(*moved, **named)
