"""``camkit explain IMAGE --model hf:PATH --prompt "..."``: what in the image made a vision-language model say each word.

For each image, the answer is generated greedily (or ``answer`` is teacher-forced) and every
token explained (:func:`camkit.explain_generation`). Writes into ``out``, per image ``NAME`` (the
file's stem made safe plus a short hash, see :func:`camkit.runs.files.safe_name`):

* ``NAME-strip.png``: one overlay per generated token, the token and its log-probability beneath
  (:func:`camkit.viz.tokens.token_strip`);
* ``NAME.html``: the answer's words; pointing at one shows its map (:func:`camkit.explain.tokens_page.token_page`);
* ``NAME.json``: the prompt, the answer and per token its index, text, id and log-probability;
* ``maps/NAME.npy``: the maps, float32 [T, H, W] at the image's own size;

and ``manifest.json`` (versions, model, method, prompt, and per image its files or its error).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CamkitError, InvalidInputError, ModelLoadError
from ..modelload.hf import load_hf_generation
from ..runs.data import error_reason, read_checked
from ..runs.files import atomic_write, encode_image, npy_bytes, refresh_umask, safe_name
from ..viz.tokens import token_strip
from .manifest import write_manifest
from .tokens_page import token_page

__all__ = ["answer_text", "explain_generation_files", "load_generation_model", "token_records"]


def load_generation_model(
    model: str | nn.Module, processor: Any = None, *, dtype: str | None = None, device: Any = None
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """``(model, processor, description)`` from ``hf:PATH`` (a local save_pretrained folder) or a loaded pair.

    Example:
        >>> from camkit.errors import ModelLoadError
        >>> from camkit.explain.generation import load_generation_model
        >>> try:
        ...     load_generation_model("torchvision:resnet18")
        ... except ModelLoadError as err:
        ...     print(str(err).split(" (")[0])
        --prompt explains vision-language models given as hf:PATH
    """
    if isinstance(model, nn.Module):
        if processor is None:
            raise InvalidInputError("give the model's processor too (transformers' AutoProcessor of the model)")
        if dtype is not None and dtype != "auto":
            model = model.to(getattr(torch, dtype))
        if device is not None:
            model = model.to(device)
        return model, processor, {"spec": type(model).__name__, "class": type(model).__name__, "notes": []}
    if not isinstance(model, str) or not model.startswith("hf:"):
        raise ModelLoadError(
            f"--prompt explains vision-language models given as hf:PATH (a local folder written by save_pretrained); "
            f"got {model!r}"
        )
    loaded, proc, notes = load_hf_generation(model[len("hf:") :], dtype=dtype, device=device)
    return loaded, proc, {"spec": model, "class": type(loaded).__name__, "notes": notes}


def token_records(result: Any, index: int = 0) -> list[dict[str, Any]]:
    """Per generated token of prompt ``index``: ``{"index", "token", "id", "log_prob"}``.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from camkit.explain.generation import token_records
        >>> r = SimpleNamespace(tokens=[[" a"]], token_ids=[torch.tensor([7])], scores=[torch.tensor([-0.5])])
        >>> token_records(r)
        [{'index': 0, 'token': ' a', 'id': 7, 'log_prob': -0.5}]
    """
    ids = result.token_ids[index].tolist()
    scores = result.scores[index].detach().float().cpu().tolist()
    return [
        {"index": t, "token": word, "id": int(ids[t]), "log_prob": float(scores[t])}
        for t, word in enumerate(result.tokens[index])
    ]


def answer_text(processor: Any, result: Any, index: int = 0) -> str:
    """The answer to prompt ``index`` as the tokenizer decodes its ids together (spaces as the tokenizer puts them).

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from camkit.explain.generation import answer_text
        >>> tokenizer = SimpleNamespace(decode=lambda ids: " ".join(str(i) for i in ids))
        >>> answer_text(SimpleNamespace(tokenizer=tokenizer), SimpleNamespace(token_ids=[torch.tensor([3, 4])]))
        '3 4'
    """
    return str(processor.tokenizer.decode(result.token_ids[index].tolist()))


def explain_generation_files(
    images: Sequence[str | os.PathLike[str]], model: str | nn.Module, processor: Any = None, *, prompt: str,
    out: str | os.PathLike[str], answer: str | None = None, method: str = "gradcam", max_new_tokens: int = 20,
    layer: str | None = None, dtype: str | None = None, device: Any = None, max_pixels: int = 64_000_000,
    **method_options: Any,
) -> dict[str, Any]:  # fmt: skip
    """Explain what a vision-language model says about each image (the Python side of ``camkit explain --prompt``).

    Args:
        images: image files.
        model: ``"hf:PATH"`` (a local ``save_pretrained`` folder with its processor), or a loaded
            transformers model (then give ``processor``).
        processor: the model's processor, with a loaded model.
        prompt: the question or instruction, the same for every image.
        out: the output folder.
        answer: an answer to explain instead of the generated one (teacher-forced).
        method: a vision-language method key (``"gradcam"``, ``"attention"``, ``"occlusion"``...).
        max_new_tokens: the longest answer generated.
        layer: Grad-CAM's layer (default: the vision features the language model receives).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` for ``hf:PATH`` (default: as saved).
        device: where to run (default: where the model is).
        max_pixels: larger images get an error entry.
        **method_options: passed on to the method.

    Returns:
        The manifest (also written as ``out/manifest.json``); each image's entry lists its files
        and answer, or its error.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("--prompt needs the question or instruction to answer about the image")
    from ..vlm.explain import explain_generation
    from ..vlm.methods import get_vlm_method

    get_vlm_method(method)  # an unknown method stops the run before any model loads
    loaded, proc, description = load_generation_model(model, processor, dtype=dtype, device=device)
    refresh_umask()
    out_dir = Path(out)
    entries: list[dict[str, Any]] = []
    for image in images:
        entry: dict[str, Any] = {"path": str(image), "note": "", "error": ""}
        entries.append(entry)
        try:
            rgb, entry["note"] = read_checked(Path(image), max_pixels)
            pixels = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
            result = explain_generation(loaded, proc, pixels, prompt, method=method, answer=answer,
                                        max_new_tokens=max_new_tokens, layer=layer, **method_options)  # fmt: skip
        except (CamkitError, OSError, ValueError) as err:  # this image only; the others go on
            entry["error"] = error_reason(err)
            continue
        _write_files(entry, rgb, result, answer_text(proc, result), prompt, method, out_dir)
    fields = {"prompt": prompt, "answer": answer, "max_new_tokens": max_new_tokens}
    return write_manifest(out_dir, description, method, layer, fields, entries)


def _write_files(entry: dict[str, Any], rgb: Any, result: Any, text: str, prompt: str, method: str, out_dir: Path) -> None:
    """One image's strip, page, tokens and maps; their paths and the answer in ``entry``."""
    stem = safe_name(entry["path"])[: -len(".png")]
    tokens = token_records(result)
    entry["answer"] = text
    entry["tokens"] = len(tokens)
    if tokens:
        atomic_write(out_dir / f"{stem}-strip.png", encode_image(token_strip(rgb, result).image, "png"))
        entry["strip"] = f"{stem}-strip.png"
    else:
        entry["note"] = (entry["note"] + "; " if entry["note"] else "") + "the answer is empty: no strip"
    atomic_write(out_dir / f"{stem}.html", token_page(rgb, result, prompt=prompt))
    record = {"path": entry["path"], "prompt": prompt, "method": method, "answer": entry["answer"], "tokens": tokens}
    atomic_write(out_dir / f"{stem}.json", json.dumps(record, indent=2, allow_nan=False))
    atomic_write(out_dir / "maps" / f"{stem}.npy", npy_bytes(result.maps[0].detach().float().cpu().numpy()))
    entry.update(page=f"{stem}.html", json=f"{stem}.json", map=f"maps/{stem}.npy")
