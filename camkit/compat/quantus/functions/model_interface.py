"""``ModelInterface``: the name Quantus gives its model wrappers, for code that annotates with it.

camkit's metric classes take the ``torch.nn.Module`` itself and wrap nothing; this class exists so
that ``from quantus.helpers.model.model_interface import ModelInterface`` imports after
``install()``. It cannot be instantiated.
"""

from __future__ import annotations

from typing import Any

from camkit.errors import InvalidInputError

__all__ = ["ModelInterface"]


class ModelInterface:
    """Quantus's model wrapper type; camkit.compat.quantus takes the model itself (never this)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise InvalidInputError(
            "camkit.compat.quantus takes the torch.nn.Module itself: pass model=your_model, not a Quantus "
            "ModelInterface"
        )
