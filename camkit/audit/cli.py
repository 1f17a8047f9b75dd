"""``camkit explain`` and ``camkit audit`` on the command line.

Exit codes: 0 all images done; 1 some images failed (their rows carry the reason); 2 bad
arguments or settings (nothing run); 130 interrupted (finished batches are kept: rerun with
``--resume``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..cli import command
from ..errors import CamkitError
from ..modelload import add_model_arguments

__all__: list[str] = []


def _method_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", default="gradcam", help="registry key of the explainer (default: gradcam)")
    parser.add_argument("--layer", help="dotted name of the layer to explain (default: automatic)")


def _explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    add_model_arguments(parser)
    _method_arguments(parser)
    parser.add_argument("--target", default="pred", help="pred (top-1, default), a class index N, or topK")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--batch-size", type=int, default=8)


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA", help="a folder of images, a folder of class folders, or a CSV manifest")
    add_model_arguments(parser)
    _method_arguments(parser)
    parser.add_argument("--target", default="pred", help="pred (default), a class index N, or label (the true class)")
    parser.add_argument("--out", required=True, help="output folder (everything is written inside it)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, help="DataLoader worker processes (default: up to 4)")
    parser.add_argument("--limit", type=int, help="audit only the first N images")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished images")
    parser.add_argument("--faithfulness", action="store_true", help="also compute deletion/insertion AUC (slow)")
    parser.add_argument("--steps", type=int, default=20, help="steps of the deletion/insertion curves (default 20)")
    parser.add_argument("--classes", help="text file with one class name per line, in the model's output order")
    parser.add_argument("--max-pixels", type=int, default=64_000_000, help="larger images give an error row")
    parser.add_argument("--save-maps", action="store_true", help="also save each map as maps/NAME.npy")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _fail(name: str, err: object) -> int:
    print(f"camkit {name}: error: {err}", file=sys.stderr)
    return 2


@command("explain", "explain image files: overlay PNGs, maps (.npy) and manifest.json", _explain_arguments)
def run_explain(args: argparse.Namespace) -> int:
    from .explain import explain_files

    try:
        manifest = explain_files(
            args.images, args.model, out=args.out, weights=args.weights, trust_pickle=args.trust_pickle,
            method=args.method, layer=args.layer, target=args.target, size=args.size, mean=args.mean, std=args.std,
            device=args.device, batch_size=args.batch_size,
        )  # fmt: skip
    except CamkitError as err:
        return _fail("explain", err)
    failed = [e for e in manifest["images"] if e["error"]]
    for entry in failed:
        print(f"failed: {entry['path']}: {entry['error']}", file=sys.stderr)
    print(
        f"explained {len(manifest['images']) - len(failed)} image(s), {len(failed)} failed; see {Path(args.out) / 'manifest.json'}"
    )
    return 1 if failed else 0


@command("audit", "audit where a model looks over a dataset: results.csv, summary.json, report.html", _audit_arguments)
def run_audit(args: argparse.Namespace) -> int:
    from .run import audit

    classes = None
    if args.classes:
        try:
            classes = [
                line.strip() for line in Path(args.classes).read_text(encoding="utf-8").splitlines() if line.strip()
            ]
        except OSError as err:
            return _fail("audit", f"cannot read --classes {args.classes}: {err}")
    try:
        summary = audit(
            args.data, args.model, out=args.out, weights=args.weights, trust_pickle=args.trust_pickle,
            method=args.method, layer=args.layer, target=args.target, size=args.size, mean=args.mean, std=args.std,
            device=args.device, batch_size=args.batch_size, workers=args.workers, limit=args.limit,
            resume=args.resume, faithfulness=args.faithfulness, steps=args.steps, classes=classes,
            max_pixels=args.max_pixels, save_maps=args.save_maps, progress=not args.no_progress,
        )  # fmt: skip
    except CamkitError as err:
        return _fail("audit", err)
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
