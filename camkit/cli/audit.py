"""``camkit explain`` and ``camkit audit`` on the command line.

Exit codes: 0 all images done; 1 some images failed (their rows carry the reason); 2 the run
could not start or go on (bad arguments, ``--out`` in use, a file or not writable, a model that
cannot be built, a missing device, an unreadable manifest): one line on stderr, the traceback
with ``--debug``; 130 interrupted (finished batches are kept: rerun with ``--resume``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._commands import command
from .models import add_model_arguments, read_class_names

__all__: list[str] = []


def _method_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", default="gradcam", help="registry key of the explainer (default: gradcam)")
    parser.add_argument("--layer", help="dotted name of the layer to explain (default: automatic)")


def _explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "images", nargs="+", metavar="FILE",
        help="image files; or NIfTI volumes (.nii, .nii.gz), videos (.mp4, .avi, .gif...) and signals (.npy)",
    )  # fmt: skip
    add_model_arguments(parser)
    _method_arguments(parser)
    parser.add_argument("--target", default="pred", help="pred (top-1, default), a class index N, or topK")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-pixels", type=int, default=64_000_000, help="larger images get an error entry")
    _media_arguments(parser)
    parser.add_argument(
        "--score-threshold", type=float, default=0.5,
        help="detectors: explain the detections scoring at least this (default 0.5)",
    )  # fmt: skip
    parser.add_argument("--top", type=int, help="detectors: at most N detections per image, best first (default: all)")
    _generation_arguments(parser)


def _generation_arguments(parser: argparse.ArgumentParser) -> None:
    """Vision-language models: see camkit.explain.generation."""
    group = parser.add_argument_group("vision-language models (--model hf:FOLDER with --prompt)")
    group.add_argument("--prompt", help="explain what the model answers to this prompt about each image, word by word")
    group.add_argument("--answer", help="explain this answer (teacher-forced) instead of the generated one")
    group.add_argument("--max-new-tokens", type=int, default=20, help="the longest answer generated (default 20)")
    group.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                       help="load the model in this dtype (default: as saved)")  # fmt: skip


def _media_arguments(parser: argparse.ArgumentParser) -> None:
    """Volumes, videos and signals: see camkit.explain.media."""
    group = parser.add_argument_group("volumes, videos and signals")
    group.add_argument("--max-voxels", type=int, default=64_000_000,
                       help="larger volumes (and videos: frames x pixels) get an error entry, unread")  # fmt: skip
    group.add_argument("--intensity", choices=("none", "minmax", "zscore", "percentile"), default="none",
                       help="volume intensity normalisation (default none: as stored)")  # fmt: skip
    group.add_argument("--frames", type=int, help="explain videos as clips of N frames (default: the whole video)")
    group.add_argument("--stride", type=int, help="frames between clip starts (default: --frames, no overlap)")
    group.add_argument("--max-frames", type=int, default=4096, help="longer videos get an error entry")
    group.add_argument("--video-format", choices=("mp4", "gif"), default="mp4", help="the overlay video's format")


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "data", metavar="DATA",
        help="a folder of images (or of NIfTI volumes or videos), a folder of class folders, or a CSV manifest",
    )  # fmt: skip
    add_model_arguments(parser)
    _method_arguments(parser)
    parser.add_argument("--target", default="pred", help="pred (default), a class index N, or label (the true class)")
    parser.add_argument("--out", required=True, help="output folder (everything is written inside it)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, help="DataLoader worker processes (default: up to 4)")
    parser.add_argument("--limit", type=int, help="audit only the first N images")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished images")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="write into a non-empty --out that is not a camkit run, or start a camkit run there afresh "
        "(camkit's own files are replaced; nothing else is removed)",
    )  # fmt: skip
    parser.add_argument("--faithfulness", action="store_true", help="also compute deletion/insertion AUC (slow)")
    parser.add_argument("--steps", type=int, default=20, help="steps of the deletion/insertion curves (default 20)")
    parser.add_argument("--classes", help="text file with one class name per line, in the model's output order")
    parser.add_argument(
        "--alphabetical-classes", action="store_true",
        help="without --classes or a class list from the model, map the sorted label names to outputs 0, 1, ...",
    )  # fmt: skip
    parser.add_argument("--max-pixels", type=int, default=64_000_000, help="larger images give an error row")
    parser.add_argument("--save-maps", action="store_true", help="also save each exact map as maps/NAME.npy (float32)")
    parser.add_argument(
        "--no-strategies", action="store_true",
        help="skip each class's strategies (clusters of its maps and concept vectors, found without masks)",
    )  # fmt: skip
    parser.add_argument(
        "--overlay-format", choices=("jpg", "png"), default="jpg",
        help="overlay files: jpg (default, quality --overlay-quality) or png; at the model input's size",
    )  # fmt: skip
    parser.add_argument("--overlay-quality", type=int, default=90, help="JPEG quality of the overlays (default 90)")
    parser.add_argument(
        "--writers", type=int, help="threads that draw, encode and write overlays (default: cores, 2-8)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    group = parser.add_argument_group("volumes and videos (DATA of NIfTI files or videos)")
    group.add_argument("--max-voxels", type=int, default=64_000_000, help="larger volumes or videos give an error row")
    group.add_argument("--intensity", choices=("none", "minmax", "zscore", "percentile"), default="none",
                       help="volume intensity normalisation (default none: as stored)")  # fmt: skip
    group.add_argument("--frames", type=int, help="audit the first N frames of each video (default: all)")


@command(
    "explain",
    "explain image files: overlay PNGs, maps (.npy) and manifest.json; with --prompt, a vision-language model's answer "
    "word by word (strip PNG, HTML, tokens JSON)",
    _explain_arguments,
)
def run_explain(args: argparse.Namespace) -> int:
    from ..explain.files import explain_files
    from ..explain.media import explain_media_files, media_kind

    if args.prompt is not None:  # a vision-language model
        return _run_generation(args)
    if any(media_kind(p) for p in args.images):  # volumes, videos and signals
        manifest = explain_media_files(
            args.images, args.model, out=args.out, weights=args.weights, trust_pickle=args.trust_pickle,
            method=args.method, layer=args.layer, target=args.target, size=args.size, mean=args.mean, std=args.std,
            device=args.device, batch_size=args.batch_size, max_voxels=args.max_voxels, intensity=args.intensity,
            frames=args.frames, stride=args.stride, max_frames=args.max_frames, video_format=args.video_format,
        )  # fmt: skip
    else:
        manifest = explain_files(
            args.images, args.model, out=args.out, weights=args.weights, trust_pickle=args.trust_pickle,
            method=args.method, layer=args.layer, target=args.target, size=args.size, mean=args.mean, std=args.std,
            device=args.device, batch_size=args.batch_size, max_pixels=args.max_pixels, crop=args.crop,
            score_threshold=args.score_threshold, top=args.top,
        )  # fmt: skip
    failed = [e for e in manifest["images"] if e["error"]]
    for entry in failed:
        print(f"failed: {entry['path']}: {entry['error']}", file=sys.stderr)
    print(
        f"explained {len(manifest['images']) - len(failed)} image(s), {len(failed)} failed; see {Path(args.out) / 'manifest.json'}"
    )
    return 1 if failed else 0


def _run_generation(args: argparse.Namespace) -> int:
    from ..errors import InvalidInputError
    from ..explain.generation import explain_generation_files

    given = [f"--{name}" for name in ("size", "crop", "mean", "std", "weights") if getattr(args, name) is not None]
    if given or args.target != "pred":
        given += ["--target"] if args.target != "pred" else []
        raise InvalidInputError(
            f"{', '.join(given)} do not apply with --prompt: the model's own processor prepares its images, and each "
            "generated token is the target"
        )
    manifest = explain_generation_files(
        args.images, args.model, prompt=args.prompt, out=args.out, answer=args.answer, method=args.method,
        max_new_tokens=args.max_new_tokens, layer=args.layer, dtype=args.dtype, device=args.device,
        max_pixels=args.max_pixels,
    )  # fmt: skip
    failed = [e for e in manifest["images"] if e["error"]]
    for entry in failed:
        print(f"failed: {entry['path']}: {entry['error']}", file=sys.stderr)
    for entry in manifest["images"]:
        if not entry["error"]:
            print(f"{entry['path']}: {entry['answer']!r} ({entry['tokens']} tokens): {Path(args.out) / entry['page']}")
    print(f"explained {len(manifest['images']) - len(failed)} image(s), {len(failed)} failed; see {Path(args.out) / 'manifest.json'}")
    return 1 if failed else 0


@command("audit", "audit where a model looks over a dataset: results.csv, summary.json, report.html", _audit_arguments)
def run_audit(args: argparse.Namespace) -> int:
    from ..audit.run import audit

    classes = read_class_names(args.classes)
    try:
        summary = audit(
            args.data, args.model, out=args.out, weights=args.weights, trust_pickle=args.trust_pickle,
            method=args.method, layer=args.layer, target=args.target, size=args.size, mean=args.mean, std=args.std,
            device=args.device, batch_size=args.batch_size, workers=args.workers, limit=args.limit,
            resume=args.resume, overwrite=args.overwrite, faithfulness=args.faithfulness, steps=args.steps,
            classes=classes, alphabetical_classes=args.alphabetical_classes, max_pixels=args.max_pixels,
            save_maps=args.save_maps, overlay_format=args.overlay_format, overlay_quality=args.overlay_quality,
            writers=args.writers, progress=not args.no_progress, crop=args.crop, max_voxels=args.max_voxels,
            intensity=args.intensity, frames=args.frames, strategies=not args.no_strategies,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(
            f"\ncamkit audit: interrupted; finished batches are saved in {Path(args.out) / 'parts'}. "
            "Run the same command with --resume to continue.", file=sys.stderr,
        )  # fmt: skip
        return 130
    if int(os.environ.get("RANK", "0")) != 0:
        return 1 if summary["errors"] else 0  # rank 0 reports
    for reason, count in summary["error_reasons"].items():
        print(f"failed: {count} image(s): {reason}", file=sys.stderr)
    print(
        f"audited {summary['processed']} of {summary['images']} image(s), {summary['errors']} failed; "
        f"report: {Path(args.out) / 'report.html'}"
    )
    return 1 if summary["errors"] else 0
