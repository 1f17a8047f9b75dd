"""The attention explainers' path for a :class:`~camkit.TokenTarget` on a vision-language model.

``camkit.AttentionRollout``, ``camkit.CheferRollout`` and ``camkit.LeGrad`` roll a vision
transformer's attention out to its own query token. Given a ``TokenTarget`` on a model of a
family camkit knows (:func:`camkit.vlm.families.family_of`), called with the image batch as ``x``
(``pixel_values``) and the sequence as the keyword input ``input_ids``, they hand the call here: the
method's own definition runs over the *language model's* layers, from the target token's row (the
row ``p - 1`` that predicts the token at ``p``) to the image tokens, as the vision-language methods
compute it (:mod:`camkit.vlm.methods.attention`, :mod:`camkit.vlm.methods.attention_gradients`).

The scores of the image tokens are laid on ``x``'s own patch grid: this path serves the families
whose ``x`` is one view per sample, ``[B, C, H, W]``, with one run of image tokens in the grid's
row-major order (LLaVA 1.5, PaliGemma, Gemma 3 without pan-and-scan crops; a class token the model
keeps is dropped). Tiles, crops and merged patches (LLaVA-NeXT, Idefics3 and SmolVLM, Qwen-VL) are
placed on the original image by :func:`camkit.explain_generation` (``method="attention"``,
``"chefer"``, ``"legrad"``), which has the processor that made them; here they are refused with that
advice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError, InvalidTargetError, UnsupportedModelError
from ..functional.tokens import infer_token_grid
from ..targets.tokens import TokenTarget
from .families.base import family_of
from .methods._language import Targets
from .methods.attention import rollout_values
from .methods.attention_gradients import chefer_values, legrad_values
from .methods.registry import MethodRequest

__all__ = ["METHODS", "check_model", "token_attention_maps"]

#: The explainers' registry keys this path serves, and the vision-language method each one is.
METHODS = {"attentionrollout": "attention", "cheferrollout": "chefer", "legrad": "legrad"}


def check_model(model: nn.Module, explainer: str) -> None:
    """Refuse, before anything runs, a model of no vision-language family camkit knows.

    Example:
        >>> from torch import nn
        >>> import camkit
        >>> try:
        ...     check_model(nn.Linear(2, 2), "CheferRollout")
        ... except camkit.UnsupportedModelError as err:
        ...     print(str(err).split(":")[0])
        CheferRollout explains a TokenTarget over a vision-language model's language model
    """
    try:
        family_of(model)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(
            f"{explainer} explains a TokenTarget over a vision-language model's language model: {err} For another "
            "model, score a token with a gradient, LRP or perturbation explainer (camkit.Saliency, camkit.AttnLRP, "
            "camkit.Occlusion...)"
        ) from None


def _per_sample(index: Tensor, batch: int, name: str) -> Tensor:
    if index.dim() < 2:
        return index.reshape(1, -1).expand(batch, -1)
    if index.shape[0] != batch:
        raise InvalidTargetError(f"{name} has shape {list(index.shape)} but the batch has {batch} samples")
    return index


def _request(model: nn.Module, inputs: Mapping[str, Any], target: TokenTarget, options: Mapping[str, Any]) -> MethodRequest:
    """The target's tokens as one request: a span per sample (``reduce="sum"``) or one target per position."""
    ids = inputs.get("input_ids")
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise InvalidInputError(
            "a TokenTarget on a vision-language model needs the sequence: pass kwargs={'input_ids': ids [B, L]} with "
            "x the pixel_values (input_index='pixel_values')"
        )
    batch, length = ids.shape
    positions = _per_sample(target.positions, batch, "positions")
    if int(positions.max()) >= length:
        raise InvalidTargetError(f"position {int(positions.max())} is past the end of the sequence (length {length})")
    tokens = ids.cpu().gather(1, positions) if target.token_ids is None else _per_sample(target.token_ids, batch, "token_ids")
    shape = (1, -1) if target.reduce == "sum" else (-1, 1)
    return MethodRequest(
        model=model, family=family_of(model), inputs=dict(inputs), layouts=[],
        positions=[p.reshape(shape) for p in positions], token_ids=[t.reshape(shape) for t in tokens], options=options,
    )  # fmt: skip


def _grid(request: MethodRequest, x: Tensor) -> tuple[list[Tensor], int, tuple[int, ...]]:
    """Each sample's image-token positions, the class tokens to drop and the patch grid over ``x``."""
    ids = request.inputs["input_ids"]
    image = request.family.image_token_id(request.model)
    positions = [(row == image).nonzero()[:, 0] for row in ids]
    counts = {int(p.numel()) for p in positions}
    advice = (
        "lays the image tokens on x's own patch grid, for one view per sample as LLaVA 1.5, PaliGemma and Gemma 3 "
        "give; for tiles, crops and merged patches use camkit.explain_generation(model, processor, images, prompt, "
        f"method={METHODS.get(str(request.options.get('key')), 'attention')!r}), which places them on the original image"
    )
    if x.dim() != 4 or len(counts) != 1 or 0 in counts:
        raise UnsupportedModelError(
            f"this path {advice}; got x of shape {list(x.shape)} and {sorted(counts)} image tokens per sample"
        )
    runs = [int((p.diff() != 1).sum()) + 1 for p in positions]
    try:
        prefix, *grid = infer_token_grid(counts.pop(), tuple(int(s) for s in x.shape[2:]))
    except InvalidInputError as err:
        raise UnsupportedModelError(f"this path {advice}: {err}") from None
    if max(runs) > 1:
        raise UnsupportedModelError(f"this path {advice}; the image tokens come in {max(runs)} runs (views)")
    return positions, prefix, tuple(grid)


def token_attention_maps(
    key: str, model: nn.Module, inputs: Mapping[str, Any], x: Tensor, target: TokenTarget,
    options: Mapping[str, Any] | None = None,
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """The explainer ``key``'s maps on ``x``'s patch grid, the targets' log-probabilities, and extras.

    Args:
        key: ``"attentionrollout"``, ``"cheferrollout"`` or ``"legrad"`` (:data:`METHODS`).
        model: a vision-language model of a family camkit knows, as loaded.
        inputs: the model's keyword inputs, ``input_ids`` [B, L] and ``x`` in its slot among them.
        x: the image batch [B, C, H, W] (``pixel_values``).
        target: the token(s) explained.
        options: the method's options (LeGrad: ``layers``).

    Returns:
        ``(raw, scores, extras)``: raw [B, K, h, w] (``reduce="none"``) or [B, h, w], float32,
        detached; scores [B, K] or [B]; extras naming the method and the layers read.

    Example:
        >>> from camkit.vlm.explainers import METHODS
        >>> METHODS["cheferrollout"]
        'chefer'
    """
    if key not in METHODS:
        raise InvalidInputError(f"no language-model path for {key!r}; these explainers have one: {', '.join(METHODS)}")
    request = _request(model, inputs, target, {**(options or {}), "key": key})
    positions, prefix, grid = _grid(request, x)
    targets = Targets.of(request)
    with torch.no_grad():
        if key == "attentionrollout":
            values, scores = rollout_values(request, targets, float(request.options.get("residual", 0.5)))
        elif key == "cheferrollout":
            values, scores = chefer_values(request, targets)
        else:
            values, scores = legrad_values(request, targets, request.options.get("layers"))
    picked = torch.stack([values[b][:, p.to(values.device)][:, prefix:] for b, p in enumerate(positions)])
    raw = picked.reshape(*picked.shape[:2], *grid).float().detach()  # [B, T, h, w]
    scores = scores.detach().float()
    if target.reduce == "sum":
        raw, scores = raw[:, 0], scores[:, 0]
    extras = {"language_model": f"{METHODS[key]} over the language model's layers, from row p - 1 to the image tokens"}
    return raw, scores, extras
