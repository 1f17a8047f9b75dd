"""PaliGemma: a SigLIP vision tower, a linear projector, and a Gemma language model.

The image is resized (squashed) to the vision tower's square; every patch is one image token (SigLIP
has no CLS row), and the tokens come first in the sequence. The prompt is a prefix the model reads
bidirectionally; answer tokens belong to the causal suffix (``token_type_ids`` 1). The default
feature layer is the vision tower's last hidden state (its ``post_layernorm``), which the projector
turns into the language model's image tokens.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import config_of, register_family
from .llava import Llava, inner_model

__all__ = ["PaliGemma"]


class PaliGemma(Llava):
    """PaliGemma (``model_type == "paligemma"``): one view per image, one token per patch.

    Example:
        >>> from camkit.vlm.families.paligemma import PaliGemma
        >>> PaliGemma().name, PaliGemma().answer_token_type
        ('paligemma', 1)
    """

    name = "paligemma"
    model_type = "paligemma"
    answer_token_type = 1

    def feature_layer(self, model: nn.Module) -> nn.Module:
        tower: Any = inner_model(model).vision_tower
        core: Any = getattr(tower, "vision_model", tower)
        last: nn.Module | None = getattr(core, "post_layernorm", None)
        return last if last is not None else core.encoder.layers[-1]

    def _skip(self, model: nn.Module) -> int:
        return 0

    def matches(self, model: nn.Module) -> bool:
        return getattr(config_of(model), "model_type", None) == self.model_type


register_family(PaliGemma())
