"""The audit loop: stream a dataset through an explainer, measure, and never lose work.

Results are saved batch by batch in ``DIR/parts/`` (each batch one JSON-lines file written
under a temporary name and renamed, so no file is ever half-written); an interruption loses
at most the batch in flight, and ``resume=True`` skips every image already in a part. When
all images are done, rank 0 merges the parts into ``results.csv``, ``summary.json`` and
``report.html``. Nothing is written outside ``out``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._version import __version__
from ..errors import CamkitError, InvalidInputError
from ..io import save_png
from ..modelload import LoadedModel, load_model, resolve_device
from ..overlay import overlay
from .data import AuditDataset, Dataset, Record, discover
from .distributed import DistContext
from .explaining import TargetSpec, build_explainer, chooser, explain_batch, parse_target

__all__ = ["AuditError", "atomic_write", "audit", "base_columns", "safe_name", "spread_and_border"]

_PARTS = "parts"
_RUN = "run.json"
# Settings that must not change between a run and its --resume (they change the results).
_FIXED = ("data", "model", "weights", "method", "layer", "target", "preprocess", "faithfulness", "steps", "classes")


class AuditError(CamkitError, RuntimeError):
    """An audit that cannot start or continue (output folder in use, changed settings on resume, ...)."""


def safe_name(key: str) -> str:
    """A file name for an image key: its stem with unsafe characters replaced, plus a short hash.

    The hash keeps names unique (``a/x.png`` and ``b/x.png``) and the name never leaves its folder.

    Example:
        >>> from camkit.audit.run import safe_name
        >>> safe_name("../<script>x.png")
        'script_x-daa1624687.png'
    """
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(key).stem).strip("._")[:60] or "image"
    return f"{stem}-{hashlib.sha1(key.encode('utf-8')).hexdigest()[:10]}.png"


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` under a temporary name in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def spread_and_border(maps: Tensor, top: float = 0.1, frame: float = 0.1) -> tuple[Tensor, Tensor]:
    """Per map [B, H, W] (non-negative): the energy share of its top ``top`` pixels, and of the border frame.

    The top share counts ``ceil(top * H * W)`` pixels; the frame is ``max(1, round(frame * min(H, W)))``
    pixels wide on each side. Maps summing to zero give NaN.

    Example:
        >>> import torch
        >>> from camkit.audit.run import spread_and_border
        >>> maps = torch.zeros(1, 10, 10); maps[0, 5, 5] = 3.0; maps[0, 0, 0] = 1.0
        >>> [round(float(v), 3) for v in spread_and_border(maps)]
        [1.0, 0.25]
    """
    _batch, height, width = maps.shape
    flat = maps.flatten(1).float()
    total = flat.sum(dim=1)
    k = max(1, math.ceil(top * height * width))
    share = flat.topk(k, dim=1).values.sum(dim=1)
    edge = max(1, round(frame * min(height, width)))
    inner = torch.zeros(height, width, dtype=torch.bool, device=maps.device)
    inner[edge : height - edge, edge : width - edge] = True
    border = (flat * (~inner).flatten()).sum(dim=1)
    nan = torch.full_like(total, float("nan"))
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, share / safe, nan), torch.where(total > 0, border / safe, nan)


def base_columns(regions: Sequence[str], faithfulness: bool) -> list[str]:
    """The columns of ``results.csv``, in order."""
    cols = ["key", "label", "prediction", "prediction_name", "confidence", "target", "correct"]
    cols += [f"energy_{r}" for r in regions]
    if "object" in regions:
        cols.append("pointing_object")
    cols += ["spread", "border"]
    if faithfulness:
        cols += ["deletion_auc", "insertion_auc"]
    return [*cols, "overlay", "note", "error"]


def _label_indices(records: Sequence[Record], categories: list[str] | None) -> tuple[list[int], list[str] | None]:
    """Class indices of the labels (-1 when unknown) and the class names by index, if known.

    With ``categories`` (``--classes`` or the weights' names) a label is looked up there;
    else labels that are all integers are indices; else the sorted distinct labels are
    numbered 0, 1, ... (the ``ImageFolder`` convention).
    """
    labels = [r.label for r in records]
    given = sorted({lab for lab in labels if lab is not None})
    if categories:
        lookup = {name: i for i, name in enumerate(categories)}
        return [lookup.get(lab, int(lab) if lab.isdigit() else -1) if lab else -1 for lab in labels], categories
    if given and all(lab.isdigit() for lab in given):
        return [int(lab) if lab else -1 for lab in labels], None
    lookup = {name: i for i, name in enumerate(given)}
    return [lookup[lab] if lab else -1 for lab in labels], (given or None)


def _read_parts(out: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    folder = out / _PARTS
    if not folder.is_dir():
        return rows
    for part in sorted(folder.glob("*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["key"]] = row
    return rows


def _config(dataset_path: Path, loaded: LoadedModel, method: str, layer: str | None, target: TargetSpec,
            faithfulness: bool, steps: int, classes: list[str] | None, regions: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    return {
        "data": str(dataset_path.resolve()), "model": loaded.spec, "weights": loaded.weights, "method": method,
        "layer": layer, "target": str(target), "preprocess": loaded.preprocess.describe(),
        "faithfulness": faithfulness, "steps": steps, "classes": classes, "regions": list(regions),
    }  # fmt: skip


def _prepare_out(out: Path, config: dict[str, Any], resume: bool, ctx: DistContext) -> None:
    run_file = out / _RUN
    existing = run_file.is_file() or (out / _PARTS).is_dir()
    if existing and not resume:
        raise AuditError(
            f"{out} already holds an audit; pass --resume (resume=True) to continue it, or choose another --out"
        )
    if resume and run_file.is_file():
        before = json.loads(run_file.read_text(encoding="utf-8"))
        changed = [k for k in _FIXED if json.loads(json.dumps(before.get(k))) != json.loads(json.dumps(config.get(k)))]
        if changed:
            raise AuditError(
                f"--resume with different settings than the run in {out}: {', '.join(changed)} changed "
                f"(was {[before.get(k) for k in changed]}); use the same settings or another --out"
            )
    ctx.barrier()  # every rank has checked before rank 0 writes anything
    if ctx.main:
        (out / _PARTS).mkdir(parents=True, exist_ok=True)
        for stale in (out / _PARTS).glob(".tmp-*"):
            stale.unlink(missing_ok=True)  # left by a killed run; never a finished part
        atomic_write(run_file, json.dumps(config, indent=2))


def audit(
    data: str | os.PathLike[str],
    model: str | nn.Module,
    *,
    out: str | os.PathLike[str],
    weights: str | None = None,
    trust_pickle: bool = False,
    method: str = "gradcam",
    layer: str | None = None,
    target: str | int | None = "pred",
    size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    device: str | torch.device | None = None,
    batch_size: int = 16,
    workers: int | None = None,
    limit: int | None = None,
    resume: bool = False,
    faithfulness: bool = False,
    steps: int = 20,
    classes: Sequence[str] | None = None,
    max_pixels: int = 64_000_000,
    save_maps: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Audit where a model's attention falls over a dataset (the Python side of ``camkit audit``).

    Args:
        data: a folder of images, a folder of class sub-folders, or a CSV manifest
            (see :mod:`camkit.audit.data`).
        model: a model description (see :func:`camkit.modelload.load_model`) or an ``nn.Module``.
        out: the output folder; everything is written inside it.
        weights, trust_pickle, size, mean, std, device: as in :func:`~camkit.modelload.load_model`.
        method, layer: the explainer (a registry key) and its layer (``None``: automatic).
        target: ``"pred"`` (the predicted class), a class index, or ``"label"`` (the true class).
        batch_size, workers: DataLoader batch size and worker processes (default: up to 4).
        limit: audit only the first ``limit`` images of the dataset's order.
        resume: continue the run already in ``out``, skipping finished images.
        faithfulness: also compute deletion and insertion AUC (``steps`` steps; costly).
        classes: class names by index (else the weights' names, else the sorted labels).
        max_pixels: images with more pixels give an error row instead of being decoded.
        save_maps: also save each map as ``maps/NAME.npy`` (float32 [H, W] in [0, 1]).
        progress: show a progress bar with images per second (rank 0).

    Returns:
        The summary written to ``summary.json`` (see :func:`camkit.audit.report.summarize`);
        its ``"errors"`` entry counts the images that failed.

    Example:
        >>> import os, tempfile, numpy as np, torch, camkit
        >>> from camkit.audit import audit
        >>> root = tempfile.mkdtemp(); os.makedirs(f"{root}/data")
        >>> for i in range(3):
        ...     camkit.save_png(f"{root}/data/{i}.png", np.full((8, 8, 3), 60 * i, np.uint8))
        >>> torch.manual_seed(0) and None
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        ...                           torch.nn.Flatten(), torch.nn.Linear(4, 2))
        >>> summary = audit(f"{root}/data", net, out=f"{root}/out", layer="1", size=8, device="cpu",
        ...                 workers=0, progress=False)
        >>> summary["images"], summary["errors"], sorted(os.listdir(f"{root}/out"))[:3]
        (3, 0, ['overlays', 'parts', 'report.html'])
    """
    from .report import write_outputs

    out_dir = Path(out)
    ctx, dev = DistContext.start(resolve_device(device))
    try:
        dataset = discover(data)
        loaded = load_model(model, weights, trust_pickle=trust_pickle, size=size, mean=mean, std=std, device=dev)
        pre = loaded.preprocess
        if pre.size is None and pre.crop is None:
            raise InvalidInputError("audits need a fixed input size: pass --size")
        shape = pre.size or pre.crop or (0, 0)
        spec = parse_target(target, allow=("pred", "class", "label"))
        names = list(classes) if classes else loaded.categories
        label_idx, class_names = _label_indices(dataset.records, names)
        config = _config(Path(data), loaded, method, layer, spec, faithfulness, steps, names, dataset.regions)
        _prepare_out(out_dir, config, resume, ctx)
        done = _read_parts(out_dir) if resume else {}
        ctx.barrier()  # all ranks have read the finished set before any rank writes a part
        session = ctx.broadcast(f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}")
        count = len(dataset.records) if limit is None else max(0, min(limit, len(dataset.records)))
        todo = [i for i in range(count) if dataset.records[i].key not in done]
        shard = todo[ctx.rank :: ctx.world]
        started = time.perf_counter()
        _run_shard(
            dataset, shard, loaded, method, layer, spec, label_idx, class_names, out_dir, session, ctx,
            batch_size=batch_size, workers=workers, faithfulness=faithfulness, steps=steps, max_pixels=max_pixels,
            save_maps=save_maps, progress=progress, shape=shape, total=len(todo),
        )  # fmt: skip
        elapsed = time.perf_counter() - started
        ctx.barrier()
        summary: dict[str, Any] | None = None
        if ctx.main:
            rows = _read_parts(out_dir)
            ordered = [rows[r.key] for r in dataset.records[:count] if r.key in rows]
            meta = {
                "camkit_version": __version__, "torch_version": torch.__version__, "model": loaded.describe(),
                "method": method, "layer": layer, "target": str(spec), "data": {"path": str(data), "kind": dataset.kind},
                "regions": list(dataset.regions), "faithfulness": faithfulness, "world_size": ctx.world,
                "seconds": round(elapsed, 3), "images_this_run": len(todo),
                "images_per_second": round(len(todo) / elapsed, 3) if elapsed > 0 else None,
            }  # fmt: skip
            summary = write_outputs(out_dir, ordered, base_columns(dataset.regions, faithfulness), meta)
        return dict(ctx.broadcast(summary))
    finally:
        ctx.finish()


def _run_shard(
    dataset: Dataset, shard: list[int], loaded: LoadedModel, method: str, layer: str | None, spec: TargetSpec,
    label_idx: list[int], class_names: list[str] | None, out: Path, session: str, ctx: DistContext, *,
    batch_size: int, workers: int | None, faithfulness: bool, steps: int, max_pixels: int, save_maps: bool,
    progress: bool, shape: tuple[int, int], total: int,
) -> None:  # fmt: skip
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be at least 1, got {batch_size}")
    dev = loaded.device
    if workers is None:
        workers = min(4, max(0, (os.cpu_count() or 1) - 1))
    items = AuditDataset(
        dataset.records, shard, loaded.preprocess, shape, dataset.box_regions, dataset.mask_regions, max_pixels
    )
    loader = DataLoader(
        items, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=dev.type == "cuda",
        persistent_workers=False, prefetch_factor=2 if workers > 0 else None,
    )  # fmt: skip
    explainer = build_explainer(method, loaded.model, layer)
    labels_all = torch.tensor(label_idx, dtype=torch.long)
    bar = tqdm(
        total=total,
        unit="img",
        disable=not (progress and ctx.main),
        desc=f"audit (rank 0 of {ctx.world})" if ctx.world > 1 else "audit",
        dynamic_ncols=True,
    )
    try:
        for seq, batch in enumerate(loader):
            rows = _audit_batch(batch, dataset, explainer, spec, labels_all, class_names, out, dev,
                                faithfulness=faithfulness, steps=steps, save_maps=save_maps)  # fmt: skip
            payload = "".join(json.dumps(row, allow_nan=True) + "\n" for row in rows)
            atomic_write(out / _PARTS / f"{session}-r{ctx.rank:03d}-{seq:06d}.jsonl", payload)
            bar.update(len(rows) * ctx.world)
    finally:
        bar.close()


def _number(value: float) -> float | None:
    return None if value != value else float(value)  # NaN -> None


def _audit_batch(
    batch: dict[str, Any], dataset: Dataset, explainer: Any, spec: TargetSpec, labels_all: Tensor,
    class_names: list[str] | None, out: Path, dev: torch.device, *, faithfulness: bool, steps: int, save_maps: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    index: list[int] = batch["index"].tolist()
    errors: list[str] = list(batch["error"])
    notes: list[str] = list(batch["note"])
    ok = [i for i, e in enumerate(errors) if not e]
    rows: list[dict[str, Any]] = []
    metrics: dict[str, Tensor] = {}
    host: dict[str, list[Any]] = {}
    if ok:
        sel = torch.tensor(ok)
        x = batch["x"][sel].to(dev, non_blocking=True)
        labels = labels_all[torch.tensor([index[i] for i in ok])]
        result = explain_batch(explainer, x, chooser(spec, labels))
        maps = result.maps.float()
        probs = result.logits.float().softmax(dim=1)
        conf, pred = probs.max(dim=1)
        metrics["prediction"], metrics["confidence"] = pred, conf
        metrics["target"] = result.classes
        for r, name in enumerate(dataset.box_regions):
            boxes = batch["boxes"][sel, r].to(dev)
            present = ~boxes.isnan().any(dim=1)
            metrics[f"energy_{name}"] = _energy(maps, torch.nan_to_num(boxes, nan=0.0), present)
            if name == "object":
                metrics["pointing_object"] = _pointing(maps, torch.nan_to_num(boxes, nan=0.0), present)
        for r, name in enumerate(dataset.mask_regions):
            masks = batch["masks"][sel, r].to(dev)
            present = batch["mask_present"][sel, r].to(dev)
            metrics[f"energy_{name}"] = _energy(maps, masks, present)
            if name == "object":
                metrics["pointing_object"] = _pointing(maps, masks, present)
        metrics["spread"], metrics["border"] = spread_and_border(maps)
        if faithfulness:
            from ..metrics import auc, deletion_curve, insertion_curve

            fr, dels = deletion_curve(explainer.model, x, maps, result.classes, steps=steps, softmax=True)
            fi, ins = insertion_curve(explainer.model, x, maps, result.classes, steps=steps, softmax=True)
            metrics["deletion_auc"], metrics["insertion_auc"] = auc(fr, dels), auc(fi, ins)
        host = {k: v.detach().cpu().tolist() for k, v in metrics.items()}  # one transfer per batch
        maps_host = maps.detach().cpu()
        shown = batch["shown"][sel]
    position = {i: j for j, i in enumerate(ok)}
    for i in range(len(index)):
        record = dataset.records[index[i]]
        row: dict[str, Any] = {"key": record.key, "label": record.label or "", "note": notes[i], "error": errors[i]}
        if i in position:
            j = position[i]
            values = {k: v[j] for k, v in host.items()}
            label = int(labels_all[index[i]])
            pred_i = int(values.pop("prediction"))
            row["prediction"] = pred_i
            row["prediction_name"] = class_names[pred_i] if class_names and pred_i < len(class_names) else str(pred_i)
            row["confidence"] = _number(values.pop("confidence"))
            row["target"] = values.pop("target")
            row["correct"] = (pred_i == label) if label >= 0 else None
            for key, value in values.items():
                row[key] = value if isinstance(value, bool) or value is None else _number(float(value))
            name = safe_name(record.key)
            save_png(out / "overlays" / name, overlay(shown[j].numpy(), maps_host[j]))
            row["overlay"] = f"overlays/{name}"
            if save_maps:
                buffer = _npy_bytes(maps_host[j].numpy())
                atomic_write(out / "maps" / (name[: -len(".png")] + ".npy"), buffer)
        rows.append(row)
    return rows


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    handle = io.BytesIO()
    np.save(handle, array.astype(np.float32))
    return handle.getvalue()


def _energy(maps: Tensor, regions: Tensor, present: Tensor) -> Tensor:
    from ..metrics import energy_pointing_game

    share = energy_pointing_game(maps, regions)
    return torch.where(present, share, torch.full_like(share, float("nan")))


def _pointing(maps: Tensor, regions: Tensor, present: Tensor) -> Tensor:
    from ..metrics import pointing_game

    hit = pointing_game(maps, regions).float()
    return torch.where(present, hit, torch.full_like(hit, float("nan")))
