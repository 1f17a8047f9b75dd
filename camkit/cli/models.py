"""The model options shared by the subcommands: ``--model``, ``--weights``, preprocessing, ``--device``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ..modelload import LoadedModel, load_model

__all__ = ["add_model_arguments", "model_from_args"]


def _size_arg(text: str) -> int | tuple[int, ...]:
    parts = re.split(r"[x,]", text.lower())
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, HxW or (volumes) DxHxW, got {text!r}") from None
    if len(values) not in (1, 2, 3) or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected N, HxW or (volumes) DxHxW with positive numbers, got {text!r}")
    return values[0] if len(values) == 1 else tuple(values)


def add_model_arguments(
    parser: argparse.ArgumentParser, *, preprocessing: bool = True, another_model: str | None = None
) -> None:
    """Add the shared model options to a subcommand's parser.

    ``--model``, ``--weights``, ``--trust-pickle`` and ``--device``; with ``preprocessing``
    also ``--size``, ``--crop``, ``--mean`` and ``--std`` (commands that build their own inputs, such
    as ``camkit layers``, pass ``preprocessing=False``). Read them back with :func:`model_from_args`.
    ``another_model``: ``--model`` may be given more than once (a list), this text saying what the
    next ones are for.
    """
    group = parser.add_argument_group("model")
    models = (
        "torchvision:NAME, timm:NAME, hf:PATH_OR_ID (a save_pretrained folder or a hub id), "
        "package.module:factory, demo or demo-vit (the bundled demo CNN or ViT with its preprocessing and class "
        "names), or a whole model saved with torch.save (needs --trust-pickle)"
    )
    if another_model is None:
        group.add_argument("--model", required=True, help=models)
    else:
        group.add_argument("--model", required=True, action="append", help=f"{models} ({another_model})")
    group.add_argument(
        "--weights",
        help="a state-dict file (.safetensors, .pth/.pt, a Lightning .ckpt), a torchvision weights name (e.g. "
        "DEFAULT), or pretrained (timm's own weights)",
    )
    group.add_argument(
        "--trust-pickle", action="store_true",
        help="allow loading a whole pickled model (this runs code from the file: only for files you trust)",
    )  # fmt: skip
    if preprocessing:
        group.add_argument(
            "--size", type=_size_arg,
            help="resize inputs to N or HxW (default: the model's own preprocessing, else 224); with --crop, N "
            "resizes the shorter side; volumes: N or DxHxW (default: their own size)",
        )  # fmt: skip
        group.add_argument("--crop", type=_size_arg, help="centre crop N or HxW after the resize")
        group.add_argument(
            "--mean", type=float, nargs=3, metavar=("R", "G", "B"),
            help="normalisation mean (default: the model's own, else ImageNet's)",
        )  # fmt: skip
        group.add_argument(
            "--std", type=float, nargs=3, metavar=("R", "G", "B"),
            help="normalisation std (default: the model's own, else ImageNet's)",
        )  # fmt: skip
    group.add_argument("--device", help="cpu, cuda, cuda:N (default: CUDA when available)")


def model_from_args(args: argparse.Namespace) -> LoadedModel:
    """:func:`load_model` from the options added by :func:`add_model_arguments`."""
    return load_model(
        args.model, args.weights, trust_pickle=args.trust_pickle, size=getattr(args, "size", None),
        mean=getattr(args, "mean", None), std=getattr(args, "std", None), device=args.device,
        crop=getattr(args, "crop", None),
    )  # fmt: skip


def read_class_names(path: str | None) -> list[str] | None:
    """The class names a ``--classes`` file lists, one per non-empty line; ``None`` without the option."""
    if not path:
        return None
    from ..runs.outdir import AuditError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise AuditError(f"cannot read --classes {path}: {err}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]
