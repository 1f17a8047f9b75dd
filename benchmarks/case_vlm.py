"""Explaining a vision-language model's answer, token by token, against generating it; and against captum 0.9.

Configurations are LLaVA 1.5 models built from code (``benchmarks/_vlm_models.py``, random weights):
``tiny`` on the CPU (``--smoke`` and the default run); on CUDA ``small`` (a ViT-B/14 tower at 336 x 336,
576 image tokens, a 1.1B Llama, bfloat16) and with ``--full`` also ``7b`` (LLaVA 1.5 7B's shape).

The answer: ``T`` tokens generated greedily once (end of sequence suppressed, so that every run has
``T`` tokens), then given to every implementation as text:

* "generate (greedy, KV cache)": ``model.generate`` of those ``T`` tokens from the processed prompt,
  the reference (a user who only asks the model);
* "camkit METHOD": :func:`camkit.explain_generation` with ``answer=`` (teacher-forced: no generation),
  every token explained, one map per token, for each registered vision-language method;
* "captum 0.9 LLMAttribution(FeatureAblation)": where camkit has ``occlusion``.

What captum 0.9 computes with an image (``ImageMaskInput``, added by its PR 1673): only its
perturbation wrapper ``LLMAttribution`` takes one (``LLMGradientAttribution`` takes text tokens
only: no gradient method of captum explains an image for a generated token). With
``FeatureAblation`` and one mask per image token's patch, its ``token_attr`` [T, N] is, for each
answer token and patch, the token's log-probability with the whole image minus that with the
patch's pixels set to the baseline colour (each patch hidden alone, the image processed again,
the answer teacher-forced: ``forward_in_tokens=False``; one forward of batch 1 per patch).
camkit's ``occlusion`` with one image token per window and the same colour (given in the
processor's normalised pixel space) computes the same quantity when the image is already at the
tower's size (the processor's resize and crop then leave it as it is, so hiding the patch before
or after processing is the same); the case uses such an image and reports the largest difference
between the two [T, N] arrays (``max diff``). No other captum path computes what a camkit method
does, so there is no other comparison.

Peak memory of one call above the loaded model, each implementation in a fresh process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from . import _vlm_models as vlm
from ._harness import BenchmarkError, Context, Goal, Row, describe_exception, memory_rows, rows_for_timings

TITLE = "Vision-language model: an answer explained"
ORDER = 34
GENERATE = "generate (greedy, KV cache)"
CAPTUM = "captum 0.9 LLMAttribution(FeatureAblation)"
BLACK = (0, 0, 0)
REPEATS = 3


def _methods(ctx: Context) -> list[str]:
    from camkit.vlm.methods import list_vlm_methods

    found = sorted(list_vlm_methods())
    if ctx.smoke:  # the runner's smoke budget: Grad-CAM, and occlusion for the comparison
        found = [m for m in found if m in ("gradcam", "occlusion")]
    return sorted(found, key=lambda m: m != "gradcam")


def _configs(ctx: Context) -> list[tuple[str, int]]:
    if ctx.device.type != "cuda":
        return [("tiny", 4 if ctx.smoke else 8)]
    return [("small", 16)] + ([("7b", 16)] if ctx.full else [])


def _answer(model: Any, processor: Any, size: str, tokens: int, device: Any) -> tuple[dict[str, Tensor], Tensor, str]:
    """The processed prompt, the ``tokens`` answer ids the model generates greedily, and their text."""
    inputs = processor(images=vlm.image(size), text=vlm.chat(processor), return_tensors="pt").to(device)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    ids = out[0, inputs["input_ids"].shape[1] :]
    return dict(inputs), ids, processor.tokenizer.decode(ids)


def _patch_masks(size: str) -> list[Tensor]:
    """One bool mask [S, S] per patch of the tower's grid, row-major: the image tokens' boxes."""
    crop, patch = vlm.SHAPES[size]["crop"], vlm.SHAPES[size]["patch"]
    masks = []
    for r in range(crop // patch):
        for c in range(crop // patch):
            mask = torch.zeros(crop, crop, dtype=torch.bool)
            mask[r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] = True
            masks.append(mask)
    return masks


def _captum(model: Any, processor: Any, size: str, answer_ids: Tensor) -> Callable[[], Tensor]:
    from captum.attr import FeatureAblation, ImageMaskInput, LLMAttribution
    from PIL import Image

    picture = Image.fromarray(vlm.image(size).permute(1, 2, 0).numpy())
    text = vlm.chat(processor)
    device = next(model.parameters()).device

    def process(img: Any) -> Any:
        return processor(images=img, text=text, return_tensors="pt").to(device)

    attribution = LLMAttribution(FeatureAblation(model), processor.tokenizer)
    masks = _patch_masks(size)

    def call() -> Tensor:
        inp = ImageMaskInput(picture, mask_list=masks, baseline=BLACK, processor_fn=process)
        with torch.no_grad():
            result = attribution.attribute(inp, target=answer_ids.cpu(), forward_in_tokens=False)
        return torch.as_tensor(result.token_attr).float().cpu()

    return call


def _black(processor: Any) -> Tensor:
    """The baseline colour in the processor's normalised pixel space, [3, 1, 1]."""
    ip = processor.image_processor
    mean, std = torch.tensor(ip.image_mean), torch.tensor(ip.image_std)
    return ((torch.tensor(BLACK, dtype=torch.float32) / 255 - mean) / std)[:, None, None]


def prepare(impl: str, model: Any, processor: Any, size: str, tokens: int) -> Callable[[], Any]:
    """A call of ``impl`` on the configuration's image, prompt and ``tokens``-token answer."""
    import camkit

    device = next(model.parameters()).device
    inputs, ids, answer = _answer(model, processor, size, tokens, device)
    if impl == GENERATE:

        def generate() -> Tensor:
            with torch.no_grad():
                return model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)

        return generate
    if impl == CAPTUM:
        return _captum(model, processor, size, ids)
    method = impl.removeprefix("camkit ")
    options: dict[str, Any] = {"baseline": _black(processor)} if method == "occlusion" else {}
    return lambda: camkit.explain_generation(model, processor, vlm.image(size), vlm.PROMPT, method=method, answer=answer,
                                             **options)  # fmt: skip


def memory_job(device: torch.device, impl: str, size: str, tokens: int) -> Callable[[], Any]:
    """Probe job: the configuration built on ``device``, ``impl`` warmed up once; returns one call."""
    model, processor = vlm.build(size, device)
    call = prepare(impl, model, processor, size, tokens)
    call()
    return call


def _occlusion_scores(result: Any) -> Tensor | None:
    """camkit occlusion's raw scores per image token [T, N] (``None`` if the result does not hold them)."""
    extras = getattr(result.explanations[0], "extras", {}) or {}
    scores = extras.get("unit_scores")
    return None if scores is None else torch.as_tensor(scores).float().cpu()


def _time(ctx: Context, size: str, tokens: int, impls: Sequence[str]) -> tuple[list[Row], dict[str, Any]]:
    model, processor = vlm.build(size, ctx.device)
    calls, outputs, rows = {}, {}, []
    for impl in impls:
        try:
            calls[impl] = prepare(impl, model, processor, size, tokens)
            outputs[impl] = calls[impl]()  # the warm-up round
        except Exception as exc:  # reported, not fatal
            rows.append(Row(TITLE, impl, size, tokens, ctx.device.type, note=describe_exception(exc)))
            calls.pop(impl, None)
    diffs, notes = {}, {}
    if CAPTUM in outputs and "camkit occlusion" in outputs:
        ours = _occlusion_scores(outputs["camkit occlusion"])
        if ours is not None and ours.shape == outputs[CAPTUM].shape:
            diffs[CAPTUM] = float((ours - outputs[CAPTUM]).abs().max())
            ctx.log(f"    max |camkit occlusion - captum| over [T, N] = {diffs[CAPTUM]:.2e}")
        else:
            notes[CAPTUM] = "camkit's occlusion scores per image token were not found in its result: not compared"
    timings = ctx.time(calls, repeats=ctx.repeats if ctx.smoke else REPEATS, warmup=0)
    # the "camkit / this" column speaks of the one anchor: captum beside camkit's occlusion (the same quantity)
    camkit_row = "camkit occlusion" if CAPTUM in timings else next((i for i in impls if i.startswith("camkit")), "")
    rows = rows_for_timings(TITLE, timings, reference=GENERATE, model=f"llava {size}, T={tokens}", batch=1,
                            device=ctx.device, camkit=camkit_row, diffs=diffs, notes=notes) + rows  # fmt: skip
    return rows, timings


def run(ctx: Context) -> Sequence[Row | Goal]:
    out: list[Row | Goal] = []
    for size, tokens in _configs(ctx):
        methods = [f"camkit {m}" for m in _methods(ctx)]
        captum = [CAPTUM] if "camkit occlusion" in methods and ctx.available("captum") else []
        impls = [GENERATE, *methods, *captum]
        ctx.log(f"  {TITLE}: llava {size}, answer of {tokens} tokens: {', '.join(impls)}")
        try:
            rows, _ = _time(ctx, size, tokens, impls)
            memory_impls = [GENERATE, methods[0]] if ctx.smoke else impls
            runs = {impl: {"impl": impl, "size": size, "tokens": tokens} for impl in memory_impls}
            peaks, failed = ctx.peaks(f"{__name__}:memory_job", runs)
        except BenchmarkError as exc:
            out.append(Row(TITLE, GENERATE, size, tokens, ctx.device.type, note=describe_exception(exc)))
            continue
        out += rows
        out += memory_rows(TITLE, peaks, reference=GENERATE, model=f"llava {size}, T={tokens}", batch=1,
                           device=ctx.device, camkit=methods[0] if methods else "camkit gradcam")  # fmt: skip
        out += [Row(TITLE, impl, size, tokens, ctx.device.type, note=why) for impl, why in failed.items()]
    return out
