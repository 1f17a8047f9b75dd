"""``explain_generation``: what in the image made a vision-language model write each word of its answer."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..explanation import Explanation
from ..functional import flat_maps, normalize_maps
from ..layers import resolve_layers
from .families.base import Family, ImageTokens, family_of
from .generate import answer_ids, generate_answers
from .methods import MethodRequest, UnitScores, get_vlm_method
from .prompts import TeacherForced, prepare, teacher_forced
from .result import GenerationExplanation

__all__ = ["explain_generation"]


def _layer(model: nn.Module, layer: str | nn.Module | None) -> nn.Module | None:
    if layer is None or isinstance(layer, nn.Module):
        return layer
    [(_, module)] = resolve_layers(model, layer)
    return module


def _say(progress: bool, text: str) -> None:
    if progress:
        sys.stderr.write(f"camkit: {text}\n")


def _package(
    units: UnitScores, layouts: list[ImageTokens], token_ids: list[Tensor], texts: list[list[str]], method: str,
    again: Any,
) -> GenerationExplanation:
    maps, explanations = [], []
    for b, layout in enumerate(layouts):
        (raw,) = layout.paint(units.scores[b], units=units.units)  # one image per prompt
        normalised, constant = normalize_maps(raw)
        flat = constant | flat_maps(raw)
        normalised = normalised.masked_fill(flat[:, None, None], 0.0)
        explanations.append(Explanation(
            maps=normalised, raw=raw, target=token_ids[b], scores=units.log_probs[b].detach().float(), flat=flat, method=method, layers=units.layers,
            extras={**units.extras, "unit_scores": units.scores[b].detach(), "units": units.units},
        ))  # fmt: skip
        maps.append(normalised)
    return GenerationExplanation(texts, token_ids, maps, [e.scores for e in explanations], explanations, method, again)


def _run(
    model: nn.Module, family: Family, method: str, forced: TeacherForced, layouts: list[ImageTokens],
    positions: list[Tensor], tokens: list[Tensor], settings: dict[str, Any],
) -> UnitScores:
    request = MethodRequest(
        model=model, family=family, inputs=forced.inputs, layouts=layouts, positions=positions, token_ids=tokens,
        layer=settings["layer"], batch_tokens=settings["batch_tokens"], progress=settings["progress"],
        options=settings["options"],
    )
    with eval_mode(model):
        return get_vlm_method(method)(request)


def _phrases(
    model: nn.Module, family: Family, method: str, forced: TeacherForced, layouts: list[ImageTokens],
    ids: list[Tensor], decode: Any, settings: dict[str, Any],
) -> Callable[[int, int], GenerationExplanation]:
    """What ``GenerationExplanation.span`` runs: tokens ``start`` to ``end`` of every answer as one target."""

    def again(start: int, end: int) -> GenerationExplanation:
        positions = [p[start:end, 0][None] for p in forced.positions]
        tokens = [t[start:end, 0][None] for t in forced.token_ids]
        _say(settings["progress"], f"explaining tokens {start} to {end} as one phrase with {method}")
        units = _run(model, family, method, forced, layouts, positions, tokens, settings)
        phrase = [[str(decode(a[start:end].tolist()))] for a in ids]
        return _package(units, layouts, [a[start:end] for a in ids], phrase, method, None)

    return again


def explain_generation(
    model: nn.Module,
    processor: Any,
    images: Any,
    prompt: str | Sequence[str],
    *,
    method: str = "gradcam",
    answer: str | Sequence[str] | None = None,
    max_new_tokens: int = 20,
    layer: str | nn.Module | None = None,
    batch_tokens: int | None = None,
    progress: bool = False,
    **method_options: Any,
) -> GenerationExplanation:
    """Explain every token of a vision-language model's answer with a map on the image.

    The answer is generated greedily (``model.generate(do_sample=False)`` with the key-value cache),
    or given (``answer=``, teacher-forced). Then one method scores, for each token, the image units
    the language model read (its image tokens, or the vision feature rows behind them); the scores
    are painted into each unit's box on the original image (tiles and crops included) and
    normalised per map. The model's parameters never get ``requires_grad``, no hook outlives the
    call, and the model's modes, ``config.use_cache`` and attention implementation stay as loaded.

    Args:
        model: a transformers vision-language model with its generation head (LLaVA, LLaVA-NeXT,
            PaliGemma, and the other families :func:`camkit.vlm.families.list_families` names).
        processor: the model's transformers processor.
        images: one image or a list (PIL images, tensors [3, H, W], arrays [H, W, 3] or paths).
        prompt: one prompt for every image, or one per image. A prompt without the processor's
            image token is put in the processor's chat template with the image before it.
        method: ``"gradcam"`` (default) or another key of :func:`camkit.vlm.methods.list_vlm_methods`.
        answer: the answer to explain instead of generating one (one for all prompts, or one per prompt).
        max_new_tokens: the most tokens generated per answer.
        layer: the module (or its dotted name) the method reads; ``None``: the method's default
            (Grad-CAM: the vision features the language model receives).
        batch_tokens: at most this many tokens per backward or perturbed batch (``None``: all).
        progress: write a line to stderr as each stage starts.
        **method_options: the method's own options.

    Returns:
        A :class:`camkit.GenerationExplanation`.

    Example:
        >>> from torch import nn
        >>> import camkit
        >>> try:  # a model of no supported family is refused before anything runs
        ...     camkit.explain_generation(nn.Linear(2, 2), None, None, "What is this?")
        ... except camkit.UnsupportedModelError as err:
        ...     print(str(err).split(";")[0])
        Linear is not a vision-language model camkit knows
    """
    family = family_of(model)
    get_vlm_method(method)  # an unknown method fails before anything runs
    settings = {"layer": _layer(model, layer), "batch_tokens": batch_tokens, "progress": progress, "options": method_options}
    prompts = prepare(model, processor, family, images, prompt)
    if answer is None:
        _say(progress, f"generating {len(prompts)} answer(s)")
        with eval_mode(model):
            answers = generate_answers(model, processor, prompts, max_new_tokens)
    else:
        answers = answer_ids(processor, answer, len(prompts))
    device = next(model.parameters()).device
    pad = getattr(processor.tokenizer, "pad_token_id", None)
    forced = teacher_forced(prompts, answers, family, 0 if pad is None else int(pad), device)
    layouts = family.layout(model, processor, forced.inputs, [p.size for p in prompts])
    decode = processor.tokenizer.decode
    texts = [[decode([t]) for t in a.tolist()] for a in answers]
    again = _phrases(model, family, method, forced, layouts, [a.long() for a in answers], decode, settings)
    if not any(a.numel() for a in answers):
        raise InvalidInputError("the model wrote no token before its end of sequence for any prompt: nothing to explain")
    _say(progress, f"explaining {sum(a.numel() for a in answers)} token(s) with {method}")
    units = _run(model, family, method, forced, layouts, forced.positions, forced.token_ids, settings)
    return _package(units, layouts, [a.long() for a in answers], texts, method, again)
