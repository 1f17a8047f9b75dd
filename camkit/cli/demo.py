"""``camkit demo``: the command over :func:`camkit.demo.run.run_demo`."""

from __future__ import annotations

import argparse

from ..demo.run import run_demo
from ._commands import command

__all__ = ["run"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="camkit-demo", help="output folder (default: camkit-demo)")
    parser.add_argument("--images", type=int, default=200, help="images to audit (default: 200)")
    parser.add_argument(
        "--method", default="gradcam++", help="second method audited next to Grad-CAM (default: gradcam++)"
    )
    parser.add_argument(
        "--gallery", default=None, help="also write README gallery images (overlay strips, report screenshot) here"
    )


@command("demo", "audit the bundled shortcut-learning model and write overlays and an HTML report", _add_arguments)
def run(args: argparse.Namespace) -> int:
    run_demo(args.out, images=args.images, method=args.method, gallery=args.gallery)
    return 0
