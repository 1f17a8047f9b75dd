"""``camkit evaluate DATA --model hf:FOLDER --prompt ...``: deletion and insertion for a vision-language model's answer.

For each image the answer is explained once per method (:func:`camkit.explain_generation`; the
methods must explain the same tokens), and each token's map is scored by how its log-probability
falls as the image tokens its map weighs most are hidden (deletion: lower is better) and rises
as they are shown on a blank image (insertion: higher is better), over the model's own image
tokens (:func:`camkit.metrics.token_deletion_curve`, :func:`camkit.metrics.token_insertion_curve`).
A hidden image token's pixels take the baseline (``0.0``: the mean colour of the processor's
normalisation) through the model family's ``occlude``; the answer stays teacher-forced. A map
ranks the tokens by its mean over each token's box (:func:`camkit.metrics.unit_scores`). A
``random`` control ranks them at random (seeded).

This is the smallest honest part of ``camkit evaluate`` for these models: two metrics, one
control, the mean over tokens and images per method, ranked by insertion minus deletion. The
classifier evaluation's other metrics, sanity gates, statistics and HTML report are not run.
Writes ``scores.csv`` (one row per image, method and token) and ``summary.json``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._version import __version__
from ..errors import CamkitError, InvalidInputError
from ..explain.generation import load_generation_model
from ..metrics import auc, token_deletion_curve, token_insertion_curve, unit_scores
from ..metrics.tokens import TokenScorer
from ..runs.data import discover, error_reason, read_checked
from ..runs.files import atomic_write
from ..targets.tokens import token_log_probs

__all__ = ["CONTROL", "evaluate_generation", "token_scorer"]

CONTROL = "random"
COLUMNS = ["key", "method", "token_index", "token", "log_prob", "deletion_auc", "insertion_auc"]


def token_scorer(model: nn.Module, family: Any, inputs: dict[str, Tensor], positions: Tensor, token_ids: Tensor,
                 baseline: float | Tensor = 0.0) -> TokenScorer:  # fmt: skip
    """A :data:`~camkit.metrics.tokens.TokenScorer` for one teacher-forced prompt (a batch of one).

    ``score(keep, tokens)`` repeats the prompt once per row, hides the image tokens where
    ``keep`` is false through ``family.occlude`` (their pixels set to ``baseline``), runs the
    model without gradients and returns the log-probability of answer token ``tokens[m]``
    (at ``positions[tokens[m]]``, the id ``token_ids[tokens[m]]``).
    """

    def score(keep: Tensor, tokens: Tensor) -> Tensor:
        rows = keep.shape[0]
        repeated = {k: torch.cat([v] * rows) for k, v in inputs.items()}
        occluded = family.occlude(model, repeated, [keep[m] for m in range(rows)], baseline)
        with torch.no_grad():
            output = model(**occluded)
        logits = output.logits if hasattr(output, "logits") else output
        where = positions.to(logits.device)[tokens.to(logits.device)][:, None]
        ids = token_ids.to(logits.device)[tokens.to(logits.device)][:, None]
        return token_log_probs(logits, where, ids)[:, 0]

    return score


def _curves(score: TokenScorer, ranking: Tensor, steps: int, chunk_size: int) -> tuple[Tensor, Tensor]:
    """Deletion and insertion AUC [T] of one ranking of the image tokens."""
    fractions, deleted = token_deletion_curve(score, ranking, steps=steps, chunk_size=chunk_size)
    _, inserted = token_insertion_curve(score, ranking, steps=steps, chunk_size=chunk_size)
    return auc(fractions, deleted), auc(fractions, inserted)


def _image_rows(key: str, image: Any, model: nn.Module, processor: Any, prompt: str, methods: Sequence[str],
                settings: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """Every method's (and the control's) AUCs for each answer token of one image."""
    from ..vlm.explain import explain_generation
    from ..vlm.families import family_of
    from ..vlm.prompts import prepare, teacher_forced

    results = {m: explain_generation(model, processor, image, prompt, method=m, answer=settings["answer"],
                                     max_new_tokens=settings["max_new_tokens"]) for m in methods}  # fmt: skip
    first = results[methods[0]]
    ids = first.token_ids[0]
    if any(not torch.equal(r.token_ids[0].cpu(), ids.cpu()) for r in results.values()):
        raise InvalidInputError("the methods explained different answers; give --answer to fix one")
    family = family_of(model)
    device = next(model.parameters()).device
    pad = getattr(processor.tokenizer, "pad_token_id", None)
    prompts = prepare(model, processor, family, image, prompt)
    forced = teacher_forced(prompts, [ids], family, 0 if pad is None else int(pad), device)
    (layout,) = family.layout(model, processor, forced.inputs, [prompts[0].size])
    score = token_scorer(model, family, dict(forced.inputs), forced.positions[0][:, 0], forced.token_ids[0][:, 0],
                         settings["baseline"])  # fmt: skip
    rankings = {m: unit_scores(r.maps[0].float().cpu(), layout.boxes.float().cpu()) for m, r in results.items()}
    generator = torch.Generator().manual_seed(settings["seed"])
    rankings[CONTROL] = torch.rand(ids.numel(), layout.count, generator=generator)
    rows = []
    log_probs = first.scores[0].tolist()
    for method, ranking in rankings.items():
        deletion, insertion = _curves(score, ranking, settings["steps"], settings["chunk_size"])
        for t, word in enumerate(first.tokens[0]):
            rows.append({"key": key, "method": method, "token_index": t, "token": word, "log_prob": log_probs[t],
                         "deletion_auc": float(deletion[t]), "insertion_auc": float(insertion[t])})  # fmt: skip
    return rows


def _summary(rows: list[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    per: dict[str, dict[str, float]] = {}
    for method in [*methods, CONTROL]:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        deletion = sum(r["deletion_auc"] for r in mine) / len(mine)
        insertion = sum(r["insertion_auc"] for r in mine) / len(mine)
        per[method] = {"tokens": len(mine), "deletion_auc": deletion, "insertion_auc": insertion,
                       "insertion_minus_deletion": insertion - deletion}  # fmt: skip
    ranking = sorted(per, key=lambda m: -per[m]["insertion_minus_deletion"])
    return {"methods": per, "ranking": ranking}


def evaluate_generation(
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], model: str | nn.Module, processor: Any = None, *,
    prompt: str, out: str | os.PathLike[str], methods: Sequence[str] | str = ("gradcam",), answer: str | None = None,
    max_new_tokens: int = 20, steps: int = 10, baseline: float | Tensor = 0.0, chunk_size: int = 8, seed: int = 0,
    dtype: str | None = None, device: Any = None, limit: int | None = None, max_pixels: int = 64_000_000,
) -> dict[str, Any]:  # fmt: skip
    """Deletion and insertion by each answer token's log-probability, per method, on a vision-language model.

    Args:
        data: a folder of images (or a CSV manifest), or a list of image files.
        model: ``"hf:FOLDER"`` or a loaded transformers model (then give ``processor``).
        processor: the model's processor, with a loaded model.
        prompt: the prompt, the same for every image.
        out: the output folder (``scores.csv``, ``summary.json``).
        methods: vision-language method keys (a list or a comma-separated string).
        answer: the answer to explain (teacher-forced) instead of the generated one.
        max_new_tokens: the longest answer generated.
        steps: steps of each curve.
        baseline: what hidden image tokens' pixels become, in the processor's normalised pixel space.
        chunk_size: perturbed prompts per forward.
        seed: the random control's seed.
        dtype, device: as for ``camkit explain --prompt``.
        limit: evaluate only the first N images.
        max_pixels: larger images get an error row.

    Returns:
        The summary (also ``out/summary.json``): per method the tokens scored and the mean deletion
        and insertion AUC, ``ranking`` (best first by insertion minus deletion), and the errors.
    """
    names = [m.strip() for m in methods.split(",")] if isinstance(methods, str) else list(methods)
    if not names or not all(names) or CONTROL in names:
        raise InvalidInputError(f"give one or more vision-language method keys (not {CONTROL!r}: it is the control)")
    if isinstance(data, (str, os.PathLike)):
        paths = [r.path for r in discover(data).records]
    else:
        paths = [Path(p) for p in data]
    paths = paths[:limit] if limit is not None else paths
    from ..vlm.methods import get_vlm_method

    for name in names:
        get_vlm_method(name)  # an unknown method stops the run before any model loads
    loaded, proc, description = load_generation_model(model, processor, dtype=dtype, device=device)
    settings = {"answer": answer, "max_new_tokens": max_new_tokens, "steps": steps, "chunk_size": chunk_size,
                "seed": seed, "baseline": baseline}  # fmt: skip
    rows: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for path in paths:
        try:
            rgb, _ = read_checked(path, max_pixels)
            pixels = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
            rows += _image_rows(str(path), pixels, loaded, proc, prompt, names, settings)
        except (CamkitError, OSError, ValueError) as err:  # this image only
            errors[str(path)] = error_reason(err)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    out_dir = Path(out)
    atomic_write(out_dir / "scores.csv", buffer.getvalue())
    summary = {"camkit_version": __version__, "model": description, "prompt": prompt, "answer": answer, "steps": steps,
               "baseline": float(baseline) if not isinstance(baseline, Tensor) else baseline.tolist(),
               "images": len(paths), "scored": len(paths) - len(errors), "errors": errors, **_summary(rows, names)}  # fmt: skip
    atomic_write(out_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=False))
    return summary
