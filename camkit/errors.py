"""The camkit error family.

Every error camkit raises on purpose is a :class:`CamkitError`, and each concrete class
also subclasses the matching built-in, so ``except ValueError`` in user code keeps working.
"""

from __future__ import annotations

__all__ = [
    "CamkitError",
    "CamkitWarning",
    "InferenceModeError",
    "InvalidInputError",
    "InvalidTargetError",
    "LayerNotFoundError",
    "LayerNotReachedError",
    "NoReLUWarning",
    "OutputSelectionError",
    "UnknownMethodError",
]


class CamkitError(Exception):
    """Base class of every error camkit raises on purpose."""


class _KeyMessage(KeyError):
    # KeyError quotes its message with repr(); show it as written.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidInputError(CamkitError, ValueError):
    """An input tensor or image has the wrong shape, dtype or values."""


class InvalidTargetError(CamkitError, ValueError):
    """A target does not fit the batch or the model's output."""


class LayerNotFoundError(CamkitError, _KeyMessage):
    """A layer name that does not exist in the model."""


class LayerNotReachedError(CamkitError, RuntimeError):
    """A target layer that the forward pass never called, or whose output does not reach the score."""


class UnknownMethodError(CamkitError, _KeyMessage):
    """A registry key that names no method."""


class OutputSelectionError(CamkitError, TypeError):
    """The model returned something the explainer cannot score."""


class InferenceModeError(CamkitError, RuntimeError):
    """An explainer that needs autograd was called under ``torch.inference_mode()``."""


class CamkitWarning(UserWarning):
    """Base class of every warning camkit issues on purpose."""


class NoReLUWarning(CamkitWarning):
    """A guided or DeconvNet rule was asked for, but the forward pass called no ReLU."""
