"""The ``camkit`` command line: ``camkit demo`` and the other subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

# Subcommands register here: name -> (help, add_arguments, run). Each run returns an exit code.
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(
    name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register a subcommand (used by the modules that implement them)."""

    def decorate(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = (help, add_arguments, run)
        return run

    return decorate


def _load_commands() -> None:
    from . import demo  # noqa: F401  (registers "demo")

    for optional in ("camkit.audit.cli", "camkit.debug.cli"):
        try:
            __import__(optional)
        except ModuleNotFoundError as err:
            if err.name is None or not optional.startswith(err.name):
                raise


def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__

    _load_commands()
    parser = argparse.ArgumentParser(prog="camkit", description="See what PyTorch image models look at.")
    parser.add_argument("--version", action="version", version=f"camkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_arguments, _) in sorted(_COMMANDS.items()):
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return _COMMANDS[args.command][2](args)


if __name__ == "__main__":
    sys.exit(main())
