"""``camkit evaluate``: rank explanation methods on a model and its data.

Exit codes: 0 done; 1 done, but some images failed (their reasons are printed); 2 the run could
not start or go on (an unknown method or metric, a metric that needs masks without them, a mask
of the wrong size, a model that returns no scores, ``--out`` in use): one line on stderr, the
traceback with ``--debug``; 130 interrupted (finished batches are kept: rerun with ``--resume``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._commands import command
from .models import add_model_arguments, read_class_names

__all__: list[str] = []


def _arguments(parser: argparse.ArgumentParser) -> None:
    from ..evaluation import DEFAULT_METHODS, METRICS

    parser.add_argument("data", metavar="DATA", help="a folder of images, a folder of class folders, or a CSV manifest")
    add_model_arguments(parser)
    parser.add_argument(
        "--methods", default=",".join(DEFAULT_METHODS),
        help=f"registry keys, comma-separated (default: {','.join(DEFAULT_METHODS)}); see camkit.list_methods()",
    )  # fmt: skip
    parser.add_argument(
        "--metrics", default="default",
        help=f"default, all, or names, comma-separated, from: {', '.join(METRICS)}",
    )  # fmt: skip
    parser.add_argument("--layer", help="dotted name of the CAM methods' layer (default: automatic)")
    parser.add_argument("--target", default="pred", help="pred (default), a class index N, or label (the true class)")
    parser.add_argument("--region", default="object", help="the manifest region used as localisation mask (default object)")
    parser.add_argument("--out", required=True, help="output folder (everything is written inside it)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N images")
    parser.add_argument("--steps", type=int, default=20, help="steps of the deletion/insertion curves (default 20)")
    parser.add_argument("--chunk-size", type=int, default=64, help="perturbed images per forward pass (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw and bootstrap (default 0)")
    parser.add_argument("--no-controls", action="store_true", help="leave out the edge, centre and RandomCAM controls")
    parser.add_argument("--no-gates", action="store_true", help="skip the sanity gates")
    parser.add_argument("--gate-images", type=int, default=8, help="images the sanity gates use (default 8)")
    parser.add_argument("--classes", help="text file with one class name per line, in the model's output order")
    parser.add_argument("--alphabetical-classes", action="store_true",
                        help="map the sorted label names to outputs 0, 1, ... (see camkit audit)")  # fmt: skip
    parser.add_argument("--max-pixels", type=int, default=64_000_000, help="larger images give an error row")
    parser.add_argument("--save-maps", action="store_true", help="also save every map as maps/METHOD-HASH/NAME-HASH.npy (float32)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished images")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --out that is not a camkit run, or start a run there afresh")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    group = parser.add_argument_group(
        "vision-language models (--model hf:FOLDER with --prompt)",
        "deletion and insertion by each answer token's log-probability over the model's image tokens, beside a "
        "random control; --methods (default gradcam), --steps, --seed, --limit and --chunk-size apply",
    )
    group.add_argument("--prompt", help="the prompt every image is answered for")
    group.add_argument("--answer", help="evaluate the maps of this answer (teacher-forced) instead of the generated one")
    group.add_argument("--max-new-tokens", type=int, default=20, help="the longest answer generated (default 20)")
    group.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="load the model in this dtype")


@command("evaluate", "rank explanation methods on your model and data: scores.csv, summary.json, report.html", _arguments)
def run_evaluate(args: argparse.Namespace) -> int:
    if args.prompt is not None:
        return _run_generation(args)
    from ..evaluation import evaluate

    classes = read_class_names(args.classes)
    try:
        summary = evaluate(
            args.data, args.model, out=args.out, methods=args.methods, metrics=args.metrics, weights=args.weights,
            trust_pickle=args.trust_pickle, layer=args.layer, target=args.target, region=args.region, size=args.size,
            crop=args.crop, mean=args.mean, std=args.std, device=args.device, batch_size=args.batch_size,
            workers=args.workers, limit=args.limit, steps=args.steps, chunk_size=args.chunk_size, seed=args.seed,
            controls=not args.no_controls, gates=not args.no_gates, gate_images=args.gate_images, classes=classes,
            alphabetical_classes=args.alphabetical_classes, max_pixels=args.max_pixels, save_maps=args.save_maps,
            resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(
            f"\ncamkit evaluate: interrupted; finished batches are saved in {Path(args.out) / 'parts'}. "
            "Run the same command with --resume to continue.", file=sys.stderr,
        )  # fmt: skip
        return 130
    if int(os.environ.get("RANK", "0")) != 0:
        return 1 if summary["errors"] else 0
    for reason, count in summary["error_reasons"].items():
        print(f"failed: {count} image(s): {reason}", file=sys.stderr)
    print(summary["verdict"]["text"])
    print(f"evaluated {summary['scored']} of {summary['images']} image(s), {summary['errors']} failed; "
          f"report: {Path(args.out) / 'report.html'}")  # fmt: skip
    return 1 if summary["errors"] else 0


def _run_generation(args: argparse.Namespace) -> int:
    from ..evaluation import DEFAULT_METHODS
    from ..evaluation.generation import evaluate_generation

    methods = "gradcam" if args.methods == ",".join(DEFAULT_METHODS) else args.methods
    chunk = min(args.chunk_size, 16)
    summary = evaluate_generation(
        args.data, args.model, prompt=args.prompt, out=args.out, methods=methods, answer=args.answer,
        max_new_tokens=args.max_new_tokens, steps=args.steps, chunk_size=chunk, seed=args.seed, dtype=args.dtype,
        device=args.device, limit=args.limit, max_pixels=args.max_pixels,
    )  # fmt: skip
    for path, reason in summary["errors"].items():
        print(f"failed: {path}: {reason}", file=sys.stderr)
    for method in summary["ranking"]:
        row = summary["methods"][method]
        print(f"{method}: insertion AUC {row['insertion_auc']:.3f}, deletion AUC {row['deletion_auc']:.3f} "
              f"(mean log-probability over {row['tokens']} token(s))")  # fmt: skip
    print(f"evaluated {summary['scored']} of {summary['images']} image(s); see {Path(args.out) / 'summary.json'}")
    return 1 if summary["errors"] else 0
