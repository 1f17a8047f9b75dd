"""The audit's output folder: refusing to overwrite what is not ours, resume checks, finished parts.

Rules (checked on every rank before anything is written):

* ``--out`` that is a file, or a folder that cannot be written, is refused.
* A non-empty folder that is not a camkit run (no ``run.json``) is refused, nothing touched,
  unless ``overwrite``; then camkit's own output names are replaced and nothing else is removed.
* A camkit run is refused unless ``resume`` (continue it) or ``overwrite`` (start afresh).
* ``resume`` needs ``run.json`` and refuses any difference in the settings it records.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import CamkitError, CamkitWarning
from .distributed import DistContext
from .files import atomic_write

__all__ = ["OUTPUT_NAMES", "AuditError", "finished_keys", "iter_part_rows", "prepare_out"]

PARTS = "parts"
RUN = "run.json"
OUTPUT_NAMES = (RUN, PARTS, "overlays", "maps", "results.csv", "scores.csv", "gates.json", "summary.json", "report.html")
"""Everything an audit or an evaluation writes into ``--out`` (``overwrite`` replaces these and only these)."""


class AuditError(CamkitError, RuntimeError):
    """An audit that cannot start or continue (output folder in use, changed settings on resume, ...)."""


def _check_writable(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise AuditError(f"--out {out} is a file; pass a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".camkit-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise AuditError(
            f"--out {out} cannot be written ({err.strerror or err}); choose a folder you can write"
        ) from None


def _differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    keys = sorted(set(before) | set(now))
    return [k for k in keys if json.loads(json.dumps(before.get(k))) != json.loads(json.dumps(now.get(k)))]


def prepare_out(out: Path, config: dict[str, Any], *, resume: bool, overwrite: bool, ctx: DistContext) -> None:
    """Check ``out`` against the rules above, then (rank 0) write ``run.json`` and make ``parts/``."""
    existed = out.is_dir()
    if out.exists() and not out.is_dir():
        raise AuditError(f"--out {out} is a file; pass a folder (it is created if missing)")
    entries = sorted(p.name for p in out.iterdir()) if existed else []
    run_file = out / RUN
    if resume:
        if not run_file.is_file():
            what = "holds parts/ but no run.json" if (out / PARTS).is_dir() else "holds no camkit run"
            raise AuditError(
                f"--resume: {out} {what}, so its settings cannot be checked; start a new run with another --out "
                "(or --overwrite to start this one afresh)"
            )
        try:
            before = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise AuditError(f"--resume: {run_file} cannot be read ({err}); start afresh with --overwrite") from None
        changed = _differences(before, config)
        if changed:
            was = {k: before.get(k) for k in changed}
            raise AuditError(
                f"--resume with different settings than the run in {out}: {', '.join(changed)} changed "
                f"(was {json.dumps(was)[:400]}); use the same settings, or another --out"
            )
    elif entries and not overwrite:
        if run_file.is_file() or (out / PARTS).is_dir():
            raise AuditError(
                f"{out} already holds an audit; pass --resume to continue it, --overwrite to replace it, "
                "or choose another --out"
            )
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        raise AuditError(
            f"--out {out} is not empty and is not a camkit run (it holds {shown}); nothing was touched. Choose an "
            "empty or new folder, or pass --overwrite to write camkit's files into it"
        )
    ctx.barrier()  # every rank has checked before rank 0 changes anything
    if ctx.main:
        _check_writable(out)
        if overwrite and not resume:
            for name in OUTPUT_NAMES:
                target = out / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
        (out / PARTS).mkdir(parents=True, exist_ok=True)
        for stale in (out / PARTS).glob(".tmp-*"):
            stale.unlink(missing_ok=True)  # left by a killed run; never a finished part
        atomic_write(run_file, json.dumps(config, indent=2), sync=True)
    ctx.barrier()


def _part_lines(part: Path) -> list[str] | str:
    """The JSON lines of a part file, or the reason it is corrupt."""
    try:
        text = part.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return f"unreadable ({err})"
    lines = [line for line in text.splitlines() if line.strip()]
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except ValueError as err:
            return f"line {number} is not JSON ({err})"
        if not isinstance(row, dict) or not isinstance(row.get("key"), str):
            return f"line {number} is not an audit row"
    return lines


def finished_keys(out: Path, ctx: DistContext) -> tuple[set[str], list[str]]:
    """Keys already in the parts of ``out``, and the corrupt parts found (rank 0 sets them aside).

    A corrupt part (not JSON, not rows) is reported with a :class:`~camkit.errors.CamkitWarning`,
    renamed to ``NAME.corrupt`` and its images are audited again.
    """
    keys: set[str] = set()
    corrupt: list[str] = []
    folder = out / PARTS
    for part in sorted(folder.glob("*.jsonl")):
        lines = _part_lines(part)
        if isinstance(lines, str):
            corrupt.append(f"{part.name}: {lines}")
            continue
        keys.update(json.loads(line)["key"] for line in lines)
    ctx.barrier()  # every rank has read the parts before rank 0 moves the corrupt ones
    if ctx.main:
        for entry in corrupt:
            name = entry.split(":", 1)[0]
            os.replace(folder / name, folder / f"{name}.corrupt")
            warnings.warn(f"camkit audit: part {entry}; its images are audited again", CamkitWarning, stacklevel=3)
    return keys, corrupt


def iter_part_rows(out: Path) -> Iterator[str]:
    """Every row (a JSON line) of the finished parts, part by part (corrupt parts are skipped)."""
    for part in sorted((out / PARTS).glob("*.jsonl")):
        lines = _part_lines(part)
        if isinstance(lines, list):
            yield from lines
