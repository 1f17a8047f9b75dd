"""``camkit app``: the explorer web app on a model, on 127.0.0.1 by default.

Exit codes: 130 the server was stopped (Ctrl-C); 2 it could not start (Gradio missing: a one-line
message naming ``pip install "camkit[app]"``; a model that cannot be built; a port in use).
"""

from __future__ import annotations

import argparse
import sys

from ._commands import command
from .models import add_model_arguments, read_class_names

__all__ = ["run_app"]


def _app_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, another_model="give it twice to compare two models in the Compare tab")
    parser.add_argument("--classes", help="text file with one class name per line, in the model's output order")
    parser.add_argument(
        "--audit", action="append", default=[], metavar="DIR",
        help="a camkit audit output folder to browse in the Audit tab (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--evaluate", action="append", default=[], metavar="DIR",
        help="a camkit evaluate output folder to show in the Evaluate tab (repeatable)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, help="the port to serve on (default: the first free one from 7860)")
    parser.add_argument(
        "--host", default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)",
    )  # fmt: skip


@command(
    "app",
    "the explorer in the browser: explain, compare and browse audits live on your model (needs camkit[app])",
    _app_arguments,
)
def run_app(args: argparse.Namespace) -> int:
    from ..explorer.entry import GradioMissingError, require_gradio

    try:
        require_gradio()
    except GradioMissingError as err:
        print(f"camkit app: {err}", file=sys.stderr)
        return 2
    from ..explorer.app import build_app
    from ..explorer.session import Session
    from ..modelload.hf import is_generation_model
    from .models import model_from_args

    if args.model[0].startswith("hf:") and is_generation_model(args.model[0][len("hf:") :]):  # a vision-language model
        from ..explorer.generation import GenerationSession

        blocks = build_app(GenerationSession(args.model[0], device=args.device))
        blocks.launch(server_name=args.host, server_port=args.port, share=False, inbrowser=False)
        return 0
    names = read_class_names(args.classes)
    sessions = [Session(model_from_args(argparse.Namespace(**{**vars(args), "model": spec})), class_names=names)
                for spec in args.model]  # fmt: skip
    more = {"compare_with": sessions[1:]} if len(sessions) > 1 else {}
    blocks = build_app(sessions[0], args.audit, args.evaluate, **more)
    blocks.launch(server_name=args.host, server_port=args.port, share=False, inbrowser=False)
    return 0
