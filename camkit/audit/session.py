"""An audit run's start and end, shared by the image audit and the media audit.

:func:`start_run` prepares the output folder and lists the work left (after ``--resume``);
:func:`finish_run` waits for every rank and (rank 0) merges the parts into ``results.csv``,
``summary.json`` and ``report.html``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, NamedTuple

import torch

from .._version import __version__
from ..runs.data import Dataset
from ..runs.distributed import DistContext
from ..runs.labels import LabelMapping
from ..runs.outdir import finished_keys, prepare_out
from .config import RunConfig, base_columns

__all__ = ["RunStart", "finish_run", "start_run"]


class RunStart(NamedTuple):
    """The work of a run once its output folder is ready.

    Attributes:
        session: the run's id, the same on every rank (parts are named after it).
        covered: how many of the dataset's records the run covers (the first ones; ``limit``).
        todo: the indices among them not finished yet.
        corrupt: the parts found unreadable, whose images are done again.
    """

    session: str
    covered: int
    todo: list[int]
    corrupt: list[str]


def start_run(cfg: RunConfig, dataset: Dataset, fingerprint: dict[str, Any], ctx: DistContext) -> RunStart:
    """Prepare ``cfg.out`` for ``fingerprint`` (``run.json``) and list the records left to audit."""
    prepare_out(cfg.out, fingerprint, resume=cfg.resume, overwrite=cfg.overwrite, ctx=ctx)
    done, corrupt = finished_keys(cfg.out, ctx) if cfg.resume else (set(), [])
    session = ctx.broadcast(f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}")
    count = len(dataset.records) if cfg.limit is None else min(cfg.limit, len(dataset.records))
    todo = [i for i in range(count) if dataset.records[i].key not in done]
    return RunStart(session, count, todo, corrupt)


def finish_run(cfg: RunConfig, dataset: Dataset, model: dict[str, Any], mapping: LabelMapping, ctx: DistContext,
               kind: str, overlays: dict[str, Any], extra: dict[str, Any], *, started: float, todo: int,
               corrupt: list[str], count: int, device: torch.device | None = None) -> dict[str, Any]:  # fmt: skip
    """Wait for every rank, then (rank 0) write run.json's metadata, results.csv and the report; the summary.

    ``model`` is the loaded model's description, ``kind`` the data's, ``extra`` keys that follow ``overlays``;
    the strategies are clustered on ``device`` (the model's; default the CPU).
    """
    from .report import write_outputs

    elapsed = time.perf_counter() - started
    ctx.barrier()
    summary: dict[str, Any] | None = None
    if ctx.main:
        meta = {
            "camkit_version": __version__, "torch_version": torch.__version__, "model": model,
            "method": cfg.method, "layer": cfg.layer, "target": str(cfg.target),
            "data": {"path": str(cfg.data), "kind": kind}, "label_mapping": mapping.describe(),
            "regions": list(dataset.regions), "faithfulness": cfg.faithfulness, "world_size": ctx.world,
            "overlays": overlays, **extra, "seconds": round(elapsed, 3), "images_this_run": todo,
            "corrupt_parts_redone": corrupt, "images_per_second": round(todo / elapsed, 3) if elapsed > 0 else None,
        }  # fmt: skip
        keys = [r.key for r in dataset.records[:count]]
        columns = base_columns(dataset.regions, cfg.faithfulness, cfg.strategies)
        summary = write_outputs(cfg.out, keys, columns, meta, strategies=cfg.strategies, device=device)
    return dict(ctx.broadcast(summary))
