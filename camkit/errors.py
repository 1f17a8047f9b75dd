"""The camkit error family.

Every error camkit raises on purpose is a :class:`CamkitError`, and each concrete class
also subclasses the matching built-in, so ``except ValueError`` in user code keeps working.
"""

from __future__ import annotations

__all__ = [
    "CamkitError",
    "CamkitWarning",
    "CaptureWarning",
    "InferenceModeError",
    "InvalidInputError",
    "InvalidTargetError",
    "LayerNotFoundError",
    "LayerNotReachedError",
    "ModelLoadError",
    "NoReLUWarning",
    "NoRuleWarning",
    "OutputSelectionError",
    "UnknownMethodError",
    "UnsupportedModelError",
]


class CamkitError(Exception):
    """Base class of every error camkit raises on purpose.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> try:
        ...     camkit.GradCAM(net, "5")(torch.rand(1, 3, 8, 8))
        ... except camkit.CamkitError as err:
        ...     type(err).__name__
        'LayerNotFoundError'
    """


class _KeyMessage(KeyError):
    # KeyError quotes its message with repr(); show it as written.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidInputError(CamkitError, ValueError):
    """An input tensor or image has the wrong shape, dtype or values.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> try:
        ...     camkit.GradCAM(net, "1")(torch.rand(3, 8, 8))  # one image without its batch dimension
        ... except camkit.InvalidInputError as err:
        ...     isinstance(err, ValueError)
        True
    """


class InvalidTargetError(CamkitError, ValueError):
    """A target does not fit the batch or the model's output.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> try:
        ...     camkit.GradCAM(net, "1")(torch.rand(2, 3, 8, 8), target=[0])  # one class for two images
        ... except camkit.InvalidTargetError:
        ...     print("raised")
        raised
    """


class LayerNotFoundError(CamkitError, _KeyMessage):
    """A layer name that does not exist in the model.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> try:
        ...     camkit.GradCAM(net, "layer4")
        ... except KeyError:
        ...     print("raised")
        raised
    """


class LayerNotReachedError(CamkitError, RuntimeError):
    """A target layer that the forward pass never called, or whose output does not reach the score.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> class TwoHeads(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.used, self.unused = nn.Conv2d(3, 2, 3), nn.Conv2d(3, 2, 3)
        ...     def forward(self, x):
        ...         return self.used(x).mean(dim=(2, 3))
        >>> try:
        ...     camkit.GradCAM(TwoHeads(), "unused")(torch.rand(1, 3, 8, 8))
        ... except camkit.LayerNotReachedError:
        ...     print("raised")
        raised
    """


class UnknownMethodError(CamkitError, _KeyMessage):
    """A registry key that names no method.

    Example:
        >>> import camkit
        >>> try:
        ...     camkit.get_method("gradcamm")
        ... except camkit.UnknownMethodError as err:
        ...     "did you mean 'gradcam'" in str(err)
        True
    """


class UnsupportedModelError(CamkitError, TypeError):
    """A model of a kind camkit has no support for here (a vision-language model of an unknown family, say).

    The message names what is supported.

    Example:
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.vlm.families import family_of
        >>> try:
        ...     family_of(nn.Linear(2, 2))
        ... except camkit.UnsupportedModelError as err:
        ...     isinstance(err, TypeError)
        True
    """


class OutputSelectionError(CamkitError, TypeError):
    """The model returned something the explainer cannot score.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> class DictOut(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv = nn.Conv2d(3, 2, 3)
        ...     def forward(self, x):
        ...         return {"scores": self.conv(x).mean(dim=(2, 3))}  # a "logits" key would be scored
        >>> x = torch.rand(1, 3, 8, 8)
        >>> try:
        ...     camkit.GradCAM(DictOut(), "conv")(x)
        ... except camkit.OutputSelectionError:
        ...     print("raised")
        raised
        >>> camkit.GradCAM(DictOut(), "conv", output="scores")(x).shape  # say what to score
        torch.Size([1, 8, 8])
    """


class InferenceModeError(CamkitError, RuntimeError):
    """An explainer that needs autograd was called under ``torch.inference_mode()``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> with torch.inference_mode():
        ...     try:
        ...         camkit.GradCAM(net, "1")(torch.rand(1, 3, 8, 8))
        ...     except camkit.InferenceModeError:
        ...         print("raised")
        raised
    """


class ModelLoadError(CamkitError, ValueError):
    """A model description, weights file or preprocessing option that cannot be used.

    Example:
        >>> import camkit
        >>> try:
        ...     camkit.load_model("resnet18")  # not one of the forms load_model reads
        ... except camkit.ModelLoadError as err:
        ...     print(err)
        --model 'resnet18' is not torchvision:NAME, timm:NAME, hf:PATH_OR_ID, ultralytics:PATH.pt, package.module:factory, or an existing file
    """


class CamkitWarning(UserWarning):
    """Base class of every warning camkit issues on purpose.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = camkit.GuidedBackprop(net)(torch.rand(1, 3, 8, 8))
        >>> any(issubclass(w.category, camkit.CamkitWarning) for w in caught)
        True
    """


class CaptureWarning(CamkitWarning):
    """An explainer made with ``compile=True`` could not capture a call as a CUDA graph; those calls run eagerly.

    The message names the reason (most often a host sync in the model's forward: ``.item()``,
    data-dependent control flow, ``nonzero``). It is issued once per input shape.

    Example:
        >>> import camkit
        >>> issubclass(camkit.CaptureWarning, camkit.CamkitWarning)
        True
    """


class NoReLUWarning(CamkitWarning):
    """A guided or DeconvNet rule was asked for, but the forward pass called no ReLU.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = camkit.GuidedBackprop(net)(torch.rand(1, 3, 8, 8))  # a Tanh network: no ReLU to guide
        >>> [w.category.__name__ for w in caught]
        ['NoReLUWarning']
    """


class NoRuleWarning(CamkitWarning):
    """A propagation method (DeepLift, LRP) met a non-linearity it has no rule for.

    The message names the operations and says what was done instead (their plain gradient).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.LogSoftmax(dim=1),
        ...                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = camkit.DeepLift(net)(torch.rand(1, 3, 8, 8))
        >>> [w.category.__name__ for w in caught]
        ['NoRuleWarning']
    """
