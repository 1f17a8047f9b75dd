"""The ``camkit`` command line: ``camkit demo``, ``camkit explain``, ``camkit audit``, ``camkit evaluate``, ``camkit layers``,
``camkit app``.

One module per subcommand (:mod:`camkit.cli.app`, :mod:`camkit.cli.audit`, :mod:`camkit.cli.debug`, :mod:`camkit.cli.demo`),
the model options they share in :mod:`camkit.cli.models`. Only this package knows argparse: the
audit, the demo and the debugging tools are called from here and never call back.

Exit codes shared by the subcommands: 0 done; 1 done, but some items failed (the command
says which); 2 could not start or could not go on (bad arguments, an output folder in use,
a model that cannot be built, a missing device, an unreadable manifest), with a one-line
message on stderr and no traceback (``--debug`` shows it); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import TextIO

from .._version import __version__
from ..errors import CamkitError, CamkitWarning
from ._commands import COMMANDS

__all__ = ["main"]


def _load_commands() -> None:
    # Each subcommand module registers itself with @command when imported. A module whose own
    # import is missing (a trimmed install) leaves its command out; any other error is raised.
    for optional in ("camkit.cli.app", "camkit.cli.audit", "camkit.cli.debug", "camkit.cli.demo", "camkit.cli.evaluate"):
        try:
            __import__(optional)
        except ModuleNotFoundError as err:
            if err.name is None or not optional.startswith(err.name):
                raise


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on a command line: its first word that is not an option (``None`` if none).

    Example:
        >>> from camkit.cli import chosen_command
        >>> chosen_command(["audit", "data", "--model", "demo"]), chosen_command(["--version"])
        ('audit', None)
    """
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``camkit`` parser; with ``command`` (a known subcommand) only that one's options are added.

    Every subcommand stays listed, with its help line; its options, whose defaults and help may
    need the modules that implement it (``camkit evaluate`` lists its metrics), are built for
    the command being run only, so ``camkit audit`` never imports the evaluation.
    """
    _load_commands()
    parser = argparse.ArgumentParser(prog="camkit", description="See what PyTorch image models look at.")
    parser.add_argument("--version", action="version", version=f"camkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_arguments, _) in sorted(COMMANDS.items()):
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if command not in COMMANDS or command == name:
            add_arguments(command_parser)
        command_parser.add_argument(
            "--debug", action="store_true", help="on an error, show the full Python traceback instead of one line"
        )
    return parser


def error_line(err: BaseException) -> str:
    """One line for an error: camkit's own messages as written, others with their type.

    Example:
        >>> from camkit.cli import error_line
        >>> error_line(ValueError("bad" + chr(10) + "thing")), error_line(KeyError("k"))
        ('ValueError: bad', "KeyError: 'k'")
    """
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(err, CamkitError):
        return first or type(err).__name__
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(chosen_command(words))
    args = parser.parse_args(words)
    if args.command is None:
        parser.print_help()
        return 2
    shown = warnings.showwarning

    def show(
        message: Warning | str, category: type[Warning], filename: str, lineno: int,
        file: TextIO | None = None, line: str | None = None,
    ) -> None:  # fmt: skip
        if issubclass(category, CamkitWarning):  # camkit's own warnings: one plain line
            print(f"camkit {args.command}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        return COMMANDS[args.command][2](args)
    except KeyboardInterrupt:
        print(f"\ncamkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line for the user; the traceback with --debug
        if getattr(args, "debug", False):
            traceback.print_exc()
        else:
            print(f"camkit {args.command}: error: {error_line(err)} (--debug shows the traceback)", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown
