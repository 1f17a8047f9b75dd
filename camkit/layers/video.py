"""Video models that take their frames before their channels, adapted to camkit's ``[B, C, T, H, W]``.

camkit's videos are ``[B, C, T, H, W]`` (PyTorch's convention, torchvision's video models).
Hugging Face's video transformers (VideoMAE, TimeSformer, ViViT) take ``pixel_values``
``[B, T, C, H, W]``: handed one of camkit's clips, they would read time as channels. Such a
model is explained through :class:`ChannelsFirstVideo`, which transposes the two axes on the
way in; camkit refuses the bare model
(:func:`camkit.layers.families.check_frames_order`) rather than guess.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..errors import InvalidInputError

__all__ = ["ChannelsFirstVideo"]


class ChannelsFirstVideo(nn.Module):
    """Run a model that takes videos ``[B, T, C, H, W]`` on videos ``[B, C, T, H, W]``.

    The model is kept as the submodule ``model`` (its layers are named ``model.<name>``) and
    called as ``model(x.transpose(1, 2), *args, **kwargs)``: nothing is copied, and its output
    comes back as the model returns it. camkit's family defaults, token layouts and prefix
    tokens look through the wrapper (:func:`camkit.default_layer` gives
    ``"model." + the model's own default``), so maps come back ``[B, T, H, W]`` with time as
    their first axis.

    Args:
        model: a model taking ``[B, T, C, H, W]`` as its first input (Hugging Face's
            ``VideoMAEForVideoClassification``, ``TimesformerForVideoClassification``,
            ``VivitForVideoClassification``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.layers import ChannelsFirstVideo
        >>> class FramesFirst(nn.Module):  # takes [B, T, C, H, W]
        ...     def forward(self, pixel_values):
        ...         return pixel_values.mean(dim=(2, 3, 4))  # one score per frame
        >>> clip = torch.zeros(1, 3, 4, 8, 8)  # [B, C, T, H, W]: 3 channels, 4 frames
        >>> clip[:, :, 2] = 1.0
        >>> ChannelsFirstVideo(FramesFirst())(clip)
        tensor([[0., 0., 1., 0.]])
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"ChannelsFirstVideo wraps a torch.nn.Module, got {type(model).__name__}")
        self.model = model

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        """``model(x.transpose(1, 2), *args, **kwargs)`` for ``x`` ``[B, C, T, H, W]``."""
        if not isinstance(x, Tensor) or x.dim() != 5:
            got = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise InvalidInputError(f"ChannelsFirstVideo takes videos [B, C, T, H, W], got {got}")
        return self.model(x.transpose(1, 2), *args, **kwargs)
