"""Attention rollout (:class:`AttentionRollout`): the model's attention propagated through its layers."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from ...errors import InvalidInputError
from ...explanation import Explanation
from ...functional.attention import attention_rollout, fuse_heads, token_relevance
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from ..registry import register_method
from .base import AttentionExplainer
from .capture import AttentionCapture

__all__ = ["AttentionRollout"]


@register_method("attentionrollout")
class AttentionRollout(AttentionExplainer):
    """Attention rollout (Abnar & Zuidema, ACL 2020): attention propagated through the layers, class-agnostic.

    ``Ā_l = 0.5 * fuse_heads(A_l) + 0.5 * I`` with rows renormalised, ``R = Ā_L ··· Ā_1``; the map is
    the class token's row of ``R`` over the patch tokens (see :func:`camkit.functional.attention_rollout`).
    The map does not depend on the target: every class gets the same map (``target`` still picks
    the scores reported).

    Args:
        model: a vision transformer.
        head_fusion: how heads are fused: ``"mean"`` (the paper), ``"max"`` or ``"min"``.
        discard_ratio: the fraction of each fused matrix's lowest entries set to zero (0: none).
        query, output, keep_mode, input_index: see :class:`AttentionExplainer`.

    Example:
        >>> import torch
        >>> from torchvision.models import VisionTransformer
        >>> import camkit
        >>> vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16)
        >>> e = camkit.AttentionRollout(vit, head_fusion="max", discard_ratio=0.5).explain(torch.rand(2, 3, 16, 16))
        >>> tuple(e.raw.shape), tuple(e.maps.shape)
        ((2, 4, 4), (2, 16, 16))
    """

    needs_grad: ClassVar[bool] = False
    cost: ClassVar[str] = "1 forward (no backward), the attention computed unfused"
    use_when: ClassVar[str] = (
        "You want where a ViT's information flows, fast and class-agnostic (the same map for every class)."
    )

    def __init__(
        self,
        model: nn.Module,
        *,
        head_fusion: str = "mean",
        discard_ratio: float = 0.0,
        query: str = "auto",
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, query=query, output=output, keep_mode=keep_mode, input_index=input_index)
        if head_fusion not in ("mean", "max", "min"):
            raise InvalidInputError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
        if not 0.0 <= discard_ratio < 1.0:
            raise InvalidInputError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
        self.head_fusion = head_fusion
        self.discard_ratio = float(discard_ratio)

    def _token_options(self) -> dict[str, Any]:
        if self.head_fusion != "mean" or self.discard_ratio:
            raise InvalidInputError(
                "a TokenTarget's rollout over the language model's layers averages the heads and discards nothing (the "
                "probabilities are recomputed one head at a time and summed); use head_fusion='mean', discard_ratio=0"
            )
        return {"residual": 0.5}  # 0.5 A + 0.5 I: rows of A sum to one, so no renormalisation changes it

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        fusion = self.head_fusion
        # heads fused as each layer runs: one [B, N, N] per layer is kept, not [B, heads, N, N]
        with AttentionCapture(self.model, gradients=False, reduce=lambda a: fuse_heads(a.float(), fusion)[:, None]) as capture:
            classes, scores = self._target_scores(x, target)
            fused = capture.attentions()
        prefix, grid, query = self._layout(fused[0].shape[-1], x)
        rollout = attention_rollout(fused, head_fusion=fusion, discard_ratio=self.discard_ratio)  # one head: fused
        row = token_relevance(rollout, prefix, query=query)
        return self._finish([row] * len(self._columns(scores)), x, grid, classes, scores)
