"""The subcommand table: each command module registers its name, help, arguments and run function."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["COMMANDS", "command"]

# Subcommands register here: name -> (help, add_arguments, run). Each run returns an exit code.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(
    name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register a subcommand (used by the modules that implement them)."""

    def decorate(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (help, add_arguments, run)
        return run

    return decorate
