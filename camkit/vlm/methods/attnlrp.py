"""AttnLRP through a vision-language model: relevance of each image token (or patch) for a written token.

The rules are :class:`camkit.AttnLRP`'s, applied by it (nothing is reimplemented here): the uniform
rule on the attention products and on gated MLPs, the softmax's own gradient, the identity rule on
RMS and layer norms and on activations, ``rule`` (epsilon or gamma) on linear layers; rotary
embeddings are products with constants, hence linear. SDPA and eager attention run as loaded.

**What is explained.** A target's relevance is its **logit** (the sum of its tokens' logits), not
its log-probability: ``log_softmax`` is not conservative (gradient x input at the logits of
``log p_t`` gives ``log p_t + H(p)``, the entropy of the next-token distribution added), while the
logit is what every rule conserves. With ``attention="cp"``, ``epsilon=0`` and no biases, the
relevance found at the inputs sums to the logit (``extras["relevance"]`` and ``extras["logits"]``);
``UnitScores.log_probs`` are still the log-probabilities.

``onto`` chooses where relevance is read:

* ``"tokens"``: at the language model's input embeddings of the image tokens (relevance through the
  language model only), summed over channels: [T_b, N_b]. Any family whose language model takes
  ``inputs_embeds``.
* ``"pixels"``: at ``pixel_values``, through the language model, the projector and the vision
  tower, summed over the pixels and channels of each feature row of the family's feature layer:
  [T_b, R_b] (a class-token row gets zero). Every family here: views cut into square patches (LLaVA,
  LLaVA-NeXT's tiles, PaliGemma, Gemma 3 with its crops, Idefics3 / SmolVLM with their crops before
  the whole image) and Qwen-VL's patch rows (``merge x merge`` rows per token, Qwen2.5-VL's window
  order undone); see :mod:`camkit.vlm.methods._pixels`. One image per prompt.
* default: ``"pixels"`` where the model allows it, else ``"tokens"``; ``extras["onto"]`` says which.

Options: ``onto``, ``attention`` (``"attnlrp"`` or ``"cp"``), ``rule``, ``epsilon``, ``gamma`` as
:class:`camkit.AttnLRP` takes them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, UnsupportedModelError
from ...explanation import Explanation
from ...hooks import HookScope
from ...methods import AttnLRP
from ._language import Targets, decoder_of, model_inputs, per_sample
from ._pixels import PixelPlan, Regrouped, as_videos, grouped, patch_relevance, row_scores
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = ["attnlrp", "patch_relevance"]

_EXPLAINER_OPTIONS = ("attention", "rule", "epsilon", "gamma", "conv_gamma")


class _Stop(Exception):
    """Ends a forward once what was needed of it has been read."""


class _LanguageHead(nn.Module):
    """The language model and its head on given input embeddings: logits of the kept rows [B, U, V]."""

    def __init__(self, model: nn.Module, decoder: nn.Module, kwargs: dict[str, Any], rows: Tensor) -> None:
        super().__init__()
        head = model.get_output_embeddings()  # type: ignore[operator]
        if not isinstance(head, nn.Module):
            raise UnsupportedModelError(f"{type(model).__name__} has no output embeddings (its generation head)")
        self.decoder, self.head = decoder, head
        self.kwargs, self.rows = kwargs, rows
        config = getattr(model.config, "text_config", model.config)
        self.cap = getattr(config, "final_logit_softcapping", None)

    def forward(self, inputs_embeds: Tensor) -> Tensor:
        hidden = self.decoder(inputs_embeds=inputs_embeds, **self.kwargs)
        hidden = hidden[0] if isinstance(hidden, (tuple, list)) else hidden.last_hidden_state
        logits: Tensor = self.head(hidden[:, self.rows])
        if self.cap:
            logits = torch.tanh(logits / self.cap) * self.cap
        return logits


def _decoder_call(request: MethodRequest, targets: Targets) -> dict[str, Any]:
    """The keyword inputs the language model gets, read in a forward stopped at its start."""
    decoder = decoder_of(request.model)
    seen: list[dict[str, Any]] = []

    def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append(dict(kwargs))
        raise _Stop

    with torch.no_grad(), HookScope() as scope:
        scope.forward_pre(decoder, before, with_kwargs=True)
        try:
            request.model(**model_inputs(request, targets))
        except _Stop:
            pass
    if not seen or not isinstance(seen[0].get("inputs_embeds"), Tensor):
        raise UnsupportedModelError(
            f"the language model ({type(decoder).__name__}) was not called with inputs_embeds; use onto='pixels' or "
            "another method for this model"
        )
    return seen[0]


def _raw(e: Explanation) -> Tensor:
    if not isinstance(e.raw, Tensor):
        raise UnsupportedModelError("AttnLRP gave no single relevance tensor for this model")
    return e.raw


def _explainer(model: nn.Module, request: MethodRequest, **kwargs: Any) -> AttnLRP:
    settings = {name: request.options[name] for name in _EXPLAINER_OPTIONS if name in request.options}
    return AttnLRP(model, **settings, **kwargs)


class _LogitTarget:
    """The targets' logits as AttnLRP's target; their log-probabilities kept aside from the same forward."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets
        self.log_probs: Tensor | None = None

    def __call__(self, logits: Tensor) -> Tensor:
        self.log_probs = self.targets.scores(logits.detach())
        return self.targets.scores(logits, log_probs=False)


Relevance = tuple[list[Tensor], Tensor, Tensor]


def _onto_tokens(request: MethodRequest, targets: Targets, target: _LogitTarget) -> Relevance:
    call = _decoder_call(request, targets)
    embeds = call.pop("inputs_embeds").detach()
    call.pop("use_cache", None)
    head = _LanguageHead(request.model, decoder_of(request.model), {**call, "use_cache": False}, targets.rows)
    e = _explainer(head, request).explain(embeds, target)
    relevance = _raw(e).sum(dim=-1)  # [B, T, L]
    positions = [layout.positions for layout in request.layouts]
    return per_sample(relevance, positions, targets.counts), e.scores, e.extras["relevance"]


def _rows_per_view(request: MethodRequest, targets: Targets) -> int:
    layer = request.family.feature_layer(request.model)  # the layer the layout's feature rows number
    shapes: list[torch.Size] = []

    def after(_: nn.Module, args: Any, output: Any) -> None:
        tensor = output if isinstance(output, Tensor) else output[0]
        shapes.append(tensor.shape)
        raise _Stop

    with torch.no_grad(), HookScope() as scope:
        scope.forward(layer, after)
        try:
            request.model(**model_inputs(request, targets))
        except _Stop:
            pass
    if not shapes or len(shapes[0]) < 2:
        raise UnsupportedModelError("the feature layer did not run or gave no [..., rows, channels] output")
    return int(shapes[0][-2])


def _patch_rows_plan(request: MethodRequest, pixels: Tensor) -> PixelPlan | str:
    """Qwen-VL's patch rows: ``merge**2`` consecutive rows per token, each sample's images in turn."""
    grid = request.inputs.get("image_grid_thw")
    merge = getattr(getattr(request.model.config, "vision_config", None), "spatial_merge_size", None)
    if not isinstance(grid, Tensor) or not isinstance(merge, int):
        return f"pixel_values {list(pixels.shape)} are rows without an image_grid_thw and a spatial_merge_size"
    per_image = grid.long().prod(dim=-1).tolist()
    counts, image = [], 0
    for layout in request.layouts:
        counts.append(int(sum(per_image[image : image + len(layout.sizes)])))
        image += len(layout.sizes)
    tokens = [int(layout.positions.numel()) * merge**2 for layout in request.layouts]
    if sum(counts) != pixels.shape[0] or counts != tokens:
        return f"pixel_values has {pixels.shape[0]} patch rows; the samples' tokens need {tokens} ({merge}x{merge} each)"
    vision = getattr(request.model.config, "vision_config", None)
    frames, patch = int(getattr(vision, "temporal_patch_size", 1)), int(getattr(vision, "patch_size", 1))
    if pixels.shape[1] % (frames * patch * patch):
        return f"patch rows of {pixels.shape[1]} values are not C x {frames} x {patch} x {patch}"
    entry = (pixels.shape[1] // (frames * patch * patch), frames, patch, patch)
    return PixelPlan("patch_rows", tuple(counts), unit=merge**2, entry=entry)


def _views_plan(request: MethodRequest, targets: Targets, pixels: Tensor) -> PixelPlan | str:
    """Views cut into square patches, one feature row each (after any class rows)."""
    patch = getattr(getattr(request.model.config, "vision_config", None), "patch_size", None)
    shape = list(pixels.shape)
    if not isinstance(patch, int) or pixels.shape[-1] % patch or pixels.shape[-2] % patch:
        return f"pixel_values {shape} are not cut into square patches of the vision tower's patch_size {patch}"
    per_view = _rows_per_view(request, targets)
    extra = per_view - (pixels.shape[-1] // patch) * (pixels.shape[-2] // patch)
    if extra not in (0, 1):
        return f"the feature layer has {per_view} rows per view, which are not the patches of pixel_values {shape}"
    counts = None
    if pixels.dim() == 4 and pixels.shape[0] != len(request.layouts):  # views concatenated over the batch
        counts = tuple(int((layout.feature_rows // per_view).unique().numel()) for layout in request.layouts)
        if sum(counts) != pixels.shape[0]:
            return f"pixel_values {shape} hold {pixels.shape[0]} views; the layouts' rows read {list(counts)}"
    return PixelPlan("views", counts, patch, per_view, extra)


def _pixel_plan(request: MethodRequest, targets: Targets) -> PixelPlan | str:
    """How relevance at ``pixel_values`` reaches the feature rows, else why it cannot."""
    pixels = request.inputs.get("pixel_values")
    if not isinstance(pixels, Tensor):
        return "the inputs have no pixel_values"
    if pixels.dim() == 2:
        return _patch_rows_plan(request, pixels)
    if pixels.dim() == 5 or (pixels.dim() == 4 and pixels.shape[0] >= len(request.layouts)):
        return _views_plan(request, targets, pixels)
    return f"pixel_values {list(pixels.shape)} are neither views [B, (V,) C, H, W] nor patch rows"


def _onto_pixels(request: MethodRequest, targets: Targets, target: _LogitTarget, plan: PixelPlan) -> Relevance:
    pixels = request.inputs["pixel_values"]
    rest = {k: v for k, v in model_inputs(request, targets).items() if k != "pixel_values"}
    if plan.counts is None:
        e = _explainer(request.model, request, input_index="pixel_values").explain(pixels, target, kwargs=rest)
    else:
        x = as_videos(pixels, plan.counts, plan.entry) if plan.entry else grouped(pixels, plan.counts)
        wrapper = Regrouped(request.model, plan, tuple(pixels.shape[1:]))
        e = _explainer(wrapper, request).explain(x, target, kwargs=rest)
    scores = row_scores(_raw(e), plan, request.layouts, targets.counts)
    return scores, e.scores, e.extras["relevance"]


@register_vlm_method("attnlrp")
def attnlrp(request: MethodRequest) -> UnitScores:
    """AttnLRP relevance of each image token (``onto="tokens"``) or feature row (``"pixels"``) for each target.

    Example:
        >>> from camkit.vlm.methods import get_vlm_method
        >>> get_vlm_method("attnlrp") is attnlrp
        True
    """
    onto = request.options.get("onto")
    if onto not in (None, "pixels", "tokens"):
        raise InvalidInputError(f"onto must be 'pixels' or 'tokens', got {onto!r}")
    targets = Targets.of(request)
    plan = _pixel_plan(request, targets) if onto != "tokens" else "not asked for"
    if onto == "pixels" and isinstance(plan, str):
        raise UnsupportedModelError(f"AttnLRP cannot read relevance onto pixels here: {plan}; use onto='tokens'")
    if onto is None:
        onto = "tokens" if isinstance(plan, str) else "pixels"
    target = _LogitTarget(targets)
    if isinstance(plan, str):
        scores, logits, relevance = _onto_tokens(request, targets, target)
    else:
        scores, logits, relevance = _onto_pixels(request, targets, target, plan)
    log_probs = target.log_probs
    if log_probs is None:  # the target was not scored: AttnLRP would have raised
        raise UnsupportedModelError("AttnLRP did not score the targets")
    counts = targets.counts
    return UnitScores(
        scores, "rows" if onto == "pixels" else "tokens", [log_probs[b, :n].float() for b, n in enumerate(counts)],
        extras={"onto": onto, "logits": [logits[b, :n] for b, n in enumerate(counts)],
                "relevance": [relevance[b, :n] for b, n in enumerate(counts)]},
    )  # fmt: skip
