"""Quantus's patch loop for ``RegionPerturbation`` and ``Selectivity`` with a caller's ``perturb_func``.

Quantus 0.6.0 pads each image to a multiple of ``patch_size`` (half the padding before, half
after: ``floor`` and ``ceil``), sums the maps (zero-padded) over the square patches of that
grid, orders the patches with numpy's ``argsort`` (``np.random.permutation`` per sample for
``order="random"``), and calls the function on the edge-padded images flattened to ``[B, F]``
with each patch's indices ``[B, C * patch_size ** 2]`` (channel, row, column order), one patch
per step, scoring the images with the padding cut off. The same loop here, on numpy as Quantus,
gives the function the arrays Quantus gives it for any ``patch_size``, ties in numpy's order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit._internal.state import eval_mode

__all__ = ["patch_order", "patch_scores", "side_padding"]


def side_padding(side: int, patch_size: int) -> tuple[int, int]:
    """Quantus's padding of one side to a multiple of ``patch_size``: ``(floor, ceil)`` of half the gap."""
    gap = -side % patch_size
    return gap // 2, gap - gap // 2


def patch_order(a: np.ndarray, patch_size: int, order: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Each sample's patches as indices into the padded, flattened input, in Quantus's order: [B, K, C * p * p].

    ``a``: the maps broadcast to the inputs, [B, C, H, W]. Also returns the padding of H and W.
    """
    batch, height, width = a.shape[0], a.shape[2], a.shape[3]
    pads = [side_padding(height, patch_size), side_padding(width, patch_size)]
    padded = np.pad(a, ((0, 0), (0, 0), *pads), mode="constant")
    grid = np.arange(padded[0].size).reshape(padded.shape[1:])
    rows, cols = padded.shape[2] // patch_size, padded.shape[3] // patch_size
    patches = np.stack([
        grid[:, r * patch_size : (r + 1) * patch_size, c * patch_size : (c + 1) * patch_size].reshape(-1)
        for r, c in np.ndindex(rows, cols)
    ])  # fmt: skip
    flat = padded.reshape(batch, -1)
    sums = np.stack([flat[:, patch].sum(axis=-1) for patch in patches], axis=-1)  # [B, K], as Quantus sums
    if order == "random":
        ranks = np.array([np.random.permutation(len(patches)) for _ in range(batch)])
    else:
        ranks = np.argsort(-sums if order == "morf" else sums, axis=-1)
    return patches[ranks], pads


def patch_scores(
    model: nn.Module, x: Tensor, y: Tensor, a: Tensor, perturb_func: Callable[..., Any], *, patch_size: int,
    order: str = "morf", regions: int | None = None, softmax: bool, chunk_size: int, drops: bool = False,
) -> Tensor:  # fmt: skip
    """The target's score [B, R] after each of the first ``regions`` patches is perturbed, Quantus's loop
    (``drops``: the clean score minus it, as ``RegionPerturbation`` returns).

    ``x`` [B, C, H, W] or [B, C, T] (seen as [B, C, 1, T], as Quantus sees it); ``a`` broadcastable to it.
    """
    shape = x.shape
    images = x if x.dim() == 4 else x[:, :, None]
    maps = a.expand_as(x).reshape(images.shape).detach().cpu().numpy()
    ordered, pads = patch_order(maps, patch_size, order)
    current = np.pad(images.detach().cpu().numpy(), ((0, 0), (0, 0), *pads), mode="edge")
    padded_shape, batch = current.shape, x.shape[0]
    (top, bottom), (left, right) = pads

    def score(inputs: Tensor) -> Tensor:
        out = torch.cat([model(chunk) for chunk in inputs.split(chunk_size)])
        return (out.softmax(dim=-1) if softmax else out).gather(1, y[:, None])[:, 0]

    scores = []
    with torch.no_grad(), eval_mode(model):
        clean = score(x) if drops else None
        for step in range(ordered.shape[1] if regions is None else min(regions, ordered.shape[1])):
            stepped = perturb_func(arr=current.reshape(batch, -1), indices=ordered[:, step])
            current = np.asarray(stepped).reshape(padded_shape)
            cut = current[:, :, top : padded_shape[2] - bottom, left : padded_shape[3] - right]
            inputs = torch.as_tensor(np.ascontiguousarray(cut), dtype=x.dtype, device=x.device).reshape(shape)
            scores.append(score(inputs) if clean is None else clean - score(inputs))
    return torch.stack(scores, dim=1)
