"""``camkit layers``: print every module call of a model with shapes, dtypes and parameter counts.

The model loader here (``torchvision:NAME`` or ``package.module:factory``, random weights)
is interim: it is meant to move to the shared loader in ``camkit/modelload.py``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import torch
from torch import nn

from ..cli import command
from ..errors import InvalidInputError

__all__ = ["load_model", "run"]


def load_model(spec: str) -> nn.Module:
    """Build a model from ``torchvision:NAME`` (weights=None) or ``package.module:factory`` (called with no arguments).

    Example:
        >>> from camkit.debug.cli import load_model
        >>> type(load_model("torchvision:resnet18")).__name__
        'ResNet'
    """
    prefix, sep, name = spec.partition(":")
    if not sep or not prefix or not name:
        raise InvalidInputError(
            f"--model {spec!r}: expected 'torchvision:NAME' (e.g. torchvision:resnet50) or "
            "'package.module:factory' (a callable returning an nn.Module)"
        )
    if prefix == "torchvision":
        import torchvision

        try:
            return torchvision.models.get_model(name, weights=None)
        except ValueError:
            raise InvalidInputError(
                f"torchvision has no model {name!r}; see torchvision.models.list_models()"
            ) from None
    try:
        factory = getattr(importlib.import_module(prefix), name)
    except (ImportError, AttributeError) as err:
        raise InvalidInputError(f"--model {spec!r}: cannot import {name!r} from {prefix!r} ({err})") from None
    model = factory()
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"--model {spec!r}: the factory returned {type(model).__name__}, not an nn.Module")
    return model


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="torchvision:NAME (random weights) or package.module:factory")
    parser.add_argument(
        "--input-shape",
        default="1,3,224,224",
        help="comma-separated input shape, batch first (default: 1,3,224,224)",
    )
    parser.add_argument("--depth", type=int, default=None, help="show calls nested at most this deep (0: the model only)")
    parser.add_argument("--inspect", action="store_true", help="also report hook traps (in-place ops, reused modules, ...)")


@command("layers", "print every module call of a model: name, type, shapes, dtypes, parameters", _add_arguments)
def run(args: argparse.Namespace) -> int:
    from .shapes import ShapeTable, trace_shapes
    from .traps import inspect

    try:
        shape = tuple(int(v) for v in args.input_shape.split(","))
    except ValueError:
        print(f"camkit layers: --input-shape {args.input_shape!r} must be integers separated by commas", file=sys.stderr)
        return 2
    try:
        model = load_model(args.model)
    except InvalidInputError as err:
        print(f"camkit layers: {err}", file=sys.stderr)
        return 2
    x = torch.zeros(shape)
    table = trace_shapes(model, x)
    if args.depth is not None:
        table = ShapeTable([r for r in table if r.depth <= args.depth], table.total_params)
    print(table)
    if args.inspect:
        findings = inspect(model, x, warn=False)
        print(f"\n{len(findings)} finding(s)")
        for finding in findings:
            print(f"- {finding}")
    return 0
