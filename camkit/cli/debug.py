"""``camkit layers``: print every module call of a model with shapes, dtypes and parameter counts.

Models load through the shared loader (:mod:`camkit.modelload`): ``torchvision:NAME`` with
optional ``--weights``, ``package.module:factory``, or a trusted whole-model file.
"""

from __future__ import annotations

import argparse
import sys

import torch

from ..errors import CamkitError
from ._commands import command
from .models import add_model_arguments, model_from_args

__all__ = ["run"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, preprocessing=False)
    parser.add_argument(
        "--input-shape",
        default="1,3,224,224",
        help="comma-separated input shape, batch first (default: 1,3,224,224)",
    )
    parser.add_argument(
        "--depth", type=int, default=None, help="show calls nested at most this deep (0: the model only)"
    )
    parser.add_argument(
        "--inspect", action="store_true", help="also report hook traps (in-place ops, reused modules, ...)"
    )


@command("layers", "print every module call of a model: name, type, shapes, dtypes, parameters", _add_arguments)
def run(args: argparse.Namespace) -> int:
    from ..debug.shapes import ShapeTable, trace_shapes
    from ..debug.traps import inspect

    try:
        shape = tuple(int(v) for v in args.input_shape.split(","))
    except ValueError:
        print(
            f"camkit layers: --input-shape {args.input_shape!r} must be integers separated by commas", file=sys.stderr
        )
        return 2
    try:
        loaded = model_from_args(args)
    except CamkitError as err:
        print(f"camkit layers: {err}", file=sys.stderr)
        return 2
    model = loaded.model
    built_training = model.training
    model.eval()  # this command built the model: run it as camkit explain and audit do
    x = torch.zeros(shape, device=loaded.device)
    table = trace_shapes(model, x)
    if args.depth is not None:
        table = ShapeTable([r for r in table if r.depth <= args.depth], table.total_params)
    print(table)
    if args.inspect:
        findings = inspect(model, x, warn=False)
        print(f"\n{len(findings)} finding(s)")
        for finding in findings:
            print(f"- {finding}")
            if finding.kind in _CLI_ADVICE:
                print(f"  on the command line: {_CLI_ADVICE[finding.kind].format(layer=finding.layer)}")
        if built_training:
            print(
                "note: --model built the model in training mode; camkit layers, explain and audit run it in eval "
                "mode (BatchNorm running statistics, no dropout), so there is nothing to do about it here."
            )
    return 0


# What a command-line user can act on, per kind of finding (the findings' own advice is for model code).
_CLI_ADVICE = {
    "inplace": "maps for --layer {layer} may use the changed values; pass a neighbouring layer as --layer, or fix "
    "the in-place operation in the model's code.",
    "reused": "--layer {layer} explains its last call only; pass a layer that runs once per forward for a map of "
    "one place in the network.",
    "functional": "methods that patch modules (guided backprop and its relatives) cannot see this call; use "
    "--method gradcam or another CAM method, or change the model's code.",
}
