"""Relevance at ``pixel_values`` summed to the units of a family's layout (its feature rows).

Two layouts of ``pixel_values`` are read, by their shape, not by family name:

* **Views** ``[B, C, H, W]`` or ``[B, V, C, H, W]`` (LLaVA, LLaVA-NeXT, PaliGemma, Gemma 3,
  Idefics3, SmolVLM), or views concatenated over the batch ``[sum V_b, C, H, W]`` (Gemma 3's
  pan-and-scan crops): square patches of ``patch_size``, each the input of one feature row. The
  feature layer sees the views in the order ``pixel_values`` holds them (padding views left out),
  so a row's view is its place among the sample's views in that order (Idefics3's crops come
  before the whole image), its patch ``row % rows_per_view`` less the class rows before them.
* **Patch rows** ``[sum N_b, C * T * P * P]`` with ``image_grid_thw`` (Qwen2-VL, Qwen2.5-VL): one
  row per patch, the ``merge**2`` patches of each language-model token consecutive, the tokens in
  sequence order; a feature row's score is that of the token it feeds (``feature_token``), which
  also undoes Qwen2.5-VL's window order.

Inputs concatenated over the batch are regrouped per sample (zero-padded) so that the explainer's
batch is the prompts' batch; the model gets them concatenated again, padding left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import UnsupportedModelError
from ..families.base import ImageTokens

__all__ = ["PixelPlan", "Regrouped", "as_videos", "grouped", "patch_relevance", "row_scores"]


@dataclass(frozen=True)
class PixelPlan:
    """How relevance at ``pixel_values`` reaches the layout's feature rows.

    Attributes:
        kind: ``"views"`` or ``"patch_rows"``.
        counts: entries of ``pixel_values``' first axis per sample where they are concatenated over the
            batch (``None``: the first axis is the batch).
        patch: a view's patch side in pixels (``"views"``).
        unit: feature rows per view (``"views"``) or patch rows per token (``"patch_rows"``).
        extra: class rows before a view's patches (``"views"``).
        entry: ``(C, T, P, P)`` of each patch row (``"patch_rows"``): regrouped, a sample's rows are one
            video ``[C, N * T, P, P]`` for the explainer (the vision tower's rank and channels).
    """

    kind: str
    counts: tuple[int, ...] | None
    patch: int = 0
    unit: int = 1
    extra: int = 0
    entry: tuple[int, ...] | None = None


def patch_relevance(raw: Tensor, patch: int) -> Tensor:
    """Relevance summed over channels and each ``patch`` x ``patch`` block: [..., C, H, W] -> [..., H/p * W/p].

    Example:
        >>> import torch
        >>> patch_relevance(torch.ones(1, 3, 4, 4), 2).tolist()
        [[12.0, 12.0, 12.0, 12.0]]
    """
    *lead, _, height, width = raw.shape
    blocks = raw.sum(dim=-3).reshape(*lead, height // patch, patch, width // patch, patch)
    return blocks.sum(dim=(-3, -1)).flatten(-2)


def grouped(pixels: Tensor, counts: tuple[int, ...]) -> Tensor:
    """``pixels`` [sum N_b, ...] as [B, max N_b, ...], each sample's entries first, zeros after.

    Example:
        >>> import torch
        >>> grouped(torch.arange(3.0)[:, None], (1, 2))[..., 0].tolist()
        [[0.0, 0.0], [1.0, 2.0]]
    """
    out = pixels.new_zeros(len(counts), max(counts), *pixels.shape[1:])
    for b, piece in enumerate(pixels.split(list(counts))):
        out[b, : piece.shape[0]] = piece
    return out


class Regrouped(nn.Module):
    """The model on per-sample groups of an input it takes concatenated over the batch.

    ``plan.counts`` entries per sample; the groups are views [B, V, C, H, W] or, where
    ``plan.entry`` is set, patch rows as videos [B, C, N * T, P, P] (see :func:`as_videos`).
    """

    def __init__(self, model: nn.Module, plan: PixelPlan, shape: tuple[int, ...], name: str = "pixel_values") -> None:
        super().__init__()
        if plan.counts is None:
            raise ValueError("Regrouped needs a plan whose input is concatenated over the batch (counts)")
        self.model, self.counts, self.entry, self.shape, self.name = model, plan.counts, plan.entry, shape, name

    def forward(self, groups: Tensor, **kwargs: Any) -> Any:
        if self.entry is not None:
            groups = groups.unflatten(2, (max(self.counts), -1)).movedim(2, 1).flatten(2)  # [B, N, C * T * P * P]
        flat = torch.cat([groups[b, :n] for b, n in enumerate(self.counts)])
        return self.model(**{self.name: flat.reshape(-1, *self.shape)}, **kwargs)


def as_videos(pixels: Tensor, counts: tuple[int, ...], entry: tuple[int, ...]) -> Tensor:
    """Patch rows [sum N_b, C * T * P * P] as one video per sample [B, C, max N_b * T, P, P], zeros after.

    Example:
        >>> import torch
        >>> as_videos(torch.ones(3, 2 * 1 * 2 * 2), (1, 2), (2, 1, 2, 2)).shape
        torch.Size([2, 2, 2, 2, 2])
    """
    rows = grouped(pixels, counts).unflatten(2, entry)  # [B, N, C, T, P, P]
    return rows.movedim(1, 2).flatten(2, 3)


def _views(raw: Tensor, plan: PixelPlan, layouts: list[ImageTokens], counts: tuple[int, ...]) -> list[Tensor]:
    patches = patch_relevance(raw, plan.patch)  # [B, T, (V,) P]
    if patches.dim() == 3:
        patches = patches[:, :, None]
    per_view = patches.shape[-1]
    patches = patches.flatten(-2)  # [B, T, V * P], views in pixel_values' order
    out = []
    for b, layout in enumerate(layouts):
        rows = layout.feature_rows.to(patches.device)
        view, place = rows // plan.unit, rows % plan.unit - plan.extra
        index = (view - view.min()) * per_view + place.clamp(min=0)
        if rows.numel() and int(index.max()) >= patches.shape[-1]:
            raise UnsupportedModelError(f"sample {b}'s feature rows reach past its {patches.shape[-1]} pixel patches")
        out.append(torch.where(place >= 0, patches[b, : counts[b]][:, index], 0.0))
    return out


def _patch_rows(raw: Tensor, plan: PixelPlan, layouts: list[ImageTokens], counts: tuple[int, ...]) -> list[Tensor]:
    width = max(plan.counts or (0,))
    rows = raw.unflatten(3, (width, -1)).sum(dim=(2, 4, 5, 6))  # [B, T, C, N, T', P, P] -> [B, T, N]
    tokens = rows.reshape(*rows.shape[:2], rows.shape[2] // plan.unit, plan.unit).sum(dim=-1)
    return [tokens[b, : counts[b]][:, layout.feature_token.to(tokens.device)] for b, layout in enumerate(layouts)]


def row_scores(raw: Tensor, plan: PixelPlan, layouts: list[ImageTokens], counts: tuple[int, ...]) -> list[Tensor]:
    """Per sample, float32 [T_b, R_b]: the relevance of each feature row's pixels (``counts``: the T_b).

    ``raw`` is the relevance at the explainer's input, [B, T, ...] (regrouped where ``plan.counts``).
    """
    split = _views if plan.kind == "views" else _patch_rows
    return [s.float() for s in split(raw.float(), plan, layouts, counts)]
