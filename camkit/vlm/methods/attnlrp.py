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
  tower, summed over each patch's pixels and channels, one score per feature row of the family's
  feature layer: [T_b, R_b] (a class-token row gets zero). For families whose ``pixel_values`` are
  images [B, C, H, W] or views [B, V, C, H, W] in feature-row order, cut into square patches, one
  image per prompt: LLaVA, LLaVA-NeXT, PaliGemma, Gemma 3. Qwen-VL (flattened patches) and
  Idefics3 / SmolVLM (tiles before the whole image) are refused with a pointer to ``"tokens"``.
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
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = ["attnlrp", "patch_relevance"]

_EXPLAINER_OPTIONS = ("attention", "rule", "epsilon", "gamma", "conv_gamma")
_PIXEL_FAMILIES = ("llava", "llava_next", "paligemma", "gemma3")  # pixel_values' views in feature-row order


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


def _pixel_geometry(request: MethodRequest, targets: Targets) -> tuple[int, int, int] | str:
    """``(patch, rows per view, class rows)`` where pixels map to feature rows one patch each, else why not."""
    pixels = request.inputs.get("pixel_values")
    patch = getattr(getattr(request.model.config, "vision_config", None), "patch_size", None)
    shape = None if pixels is None else list(pixels.shape)
    if request.family.name not in _PIXEL_FAMILIES:
        return f"the views of {request.family.name} are not laid out in pixel_values as its feature rows are"
    if (pixels is None or pixels.dim() not in (4, 5) or pixels.shape[0] != len(request.layouts)
            or not isinstance(patch, int) or pixels.shape[-1] % patch or pixels.shape[-2] % patch):  # fmt: skip
        return f"pixel_values {shape} are not [B, (V,) C, H, W] in square patches, one image per prompt"
    per_view = _rows_per_view(request, targets)
    extra = per_view - (pixels.shape[-1] // patch) * (pixels.shape[-2] // patch)
    if extra not in (0, 1):
        return f"the feature layer has {per_view} rows per view, which are not the patches of pixel_values {shape}"
    return patch, per_view, extra


def _onto_pixels(
    request: MethodRequest, targets: Targets, target: _LogitTarget, geometry: tuple[int, int, int]
) -> Relevance:
    patch, per_view, extra = geometry
    pixels = request.inputs["pixel_values"]
    rest = {k: v for k, v in model_inputs(request, targets).items() if k != "pixel_values"}
    e = _explainer(request.model, request, input_index="pixel_values").explain(pixels, target, kwargs=rest)
    patches = patch_relevance(_raw(e).float(), patch)  # [B, T, (V,) P]
    if patches.dim() == 3:
        patches = patches[:, :, None]
    out = []
    for b, layout in enumerate(request.layouts):
        rows = layout.feature_rows.to(patches.device)
        index = rows % per_view - extra
        views = layout.feature_view.to(patches.device)
        values = patches[b, : targets.counts[b]][:, views, index.clamp(min=0)]
        out.append(torch.where(index >= 0, values, 0.0))
    return out, e.scores, e.extras["relevance"]


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
    geometry = _pixel_geometry(request, targets) if onto != "tokens" else "not asked for"
    if onto == "pixels" and isinstance(geometry, str):
        raise UnsupportedModelError(f"AttnLRP cannot read relevance onto pixels here: {geometry}; use onto='tokens'")
    if onto is None:
        onto = "tokens" if isinstance(geometry, str) else "pixels"
    target = _LogitTarget(targets)
    if isinstance(geometry, str):
        scores, logits, relevance = _onto_tokens(request, targets, target)
    else:
        scores, logits, relevance = _onto_pixels(request, targets, target, geometry)
    log_probs = target.log_probs
    if log_probs is None:  # the target was not scored: AttnLRP would have raised
        raise UnsupportedModelError("AttnLRP did not score the targets")
    counts = targets.counts
    return UnitScores(
        scores, "rows" if onto == "pixels" else "tokens", [log_probs[b, :n].float() for b, n in enumerate(counts)],
        extras={"onto": onto, "logits": [logits[b, :n] for b, n in enumerate(counts)],
                "relevance": [relevance[b, :n] for b, n in enumerate(counts)]},
    )  # fmt: skip
