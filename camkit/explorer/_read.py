"""Reading camkit's output files for the explorer: CSV rows with their numbers parsed, JSON objects, clear errors."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

__all__ = ["cell", "folder_of", "holds", "order", "read_csv", "read_json"]

_INTEGERS = ("prediction", "target", "control")
_FLOATS = ("confidence", "spread", "border", "pointing_object", "deletion_auc", "insertion_auc", "value")


def _number(text: str, kind: type) -> Any:
    try:
        value = kind(float(text)) if kind is int else float(text)
    except ValueError:
        return text
    return value


def _parse(row: Mapping[str, str | None]) -> dict[str, Any]:
    """A CSV row with its numbers as numbers, ``correct`` as True/False/None and empty cells as None."""
    out: dict[str, Any] = {}
    for name, raw in row.items():
        if name is None:  # cells beyond the header: a malformed line, ignored
            continue
        text = (raw or "").strip()
        if not text:
            out[name] = None
        elif name == "correct":
            out[name] = {"1": True, "0": False, "true": True, "false": False}.get(text.lower())
        elif name in _INTEGERS:
            out[name] = _number(text, int)
        elif name in _FLOATS or name.startswith("energy_"):
            out[name] = _number(text, float)
        else:
            out[name] = text
    return out


def read_csv(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The header and the parsed rows of a CSV file; an error when it cannot be read."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = [_parse(r) for r in reader]
            return list(reader.fieldnames or []), rows
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise InvalidInputError(f"{path} cannot be read as CSV ({err}); is it a camkit run's output?") from None


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is missing, an error when it is not a JSON object."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InvalidInputError(f"{path} cannot be read as JSON ({err}); is it a camkit run's output?") from None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{path} holds a JSON {type(value).__name__}, expected an object (a camkit summary)")
    return value


def folder_of(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a folder, or an error naming the `camkit what` command whose --out it should be."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        state = "is a file" if folder.exists() else "does not exist"
        raise InvalidInputError(f"the {what} folder {folder} {state}; pass the --out folder of `camkit {what}`")
    return folder


def holds(folder: Path) -> str:
    """The first names in ``folder``, for an error message."""
    names = sorted(p.name for p in folder.iterdir())
    return ", ".join(names[:6]) + (" ..." if len(names) > 6 else "") if names else "nothing"


def order(value: Any) -> tuple[int, float, str]:
    """A sort key: numbers (bools too) by value, then text, then empty cells."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (2, 0.0, "")
    if isinstance(value, (bool, int, float)):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def cell(value: Any) -> Any:
    """A value for a table cell: floats rounded to 4 digits, NaN as None."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    return value
