"""The evaluation loop: explain every image once with every method, score every map, never lose work.

Data, models and preprocessing are read as ``camkit audit`` reads them (:mod:`camkit.runs.data`,
:mod:`camkit.modelload`), the output folder follows the audit's rules (:mod:`camkit.runs.outdir`:
never writing into a folder that is not a camkit run, ``resume`` refusing changed settings) and
``torchrun`` shards the images as the audit does (:mod:`camkit.runs.distributed`). Each batch:
one forward pass picks the classes to explain; every method and control explains them once
(the maps stay in memory for the batch; ``save_maps`` writes them); every metric scores every
map; the batch's rows go to ``parts/`` as one JSON-lines file. The sanity gates run once, on the
first images, before the loop (``gates.json``). When every image is done, rank 0 merges the parts
(:mod:`camkit.evaluation.outputs`).
"""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._internal.checks import check_logits
from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..metrics import region_masks
from ..modelload import LoadedModel, Preprocess, load_model, resolve_device, warn_random_weights
from ..runs.data import AuditDataset, Dataset, discover
from ..runs.distributed import DistContext
from ..runs.files import atomic_write, refresh_umask, safe_name
from ..runs.labels import LabelMapping, LabelMappingError, map_labels
from ..runs.loaders import make_loader
from ..runs.outdir import AuditError, finished_keys, prepare_out
from ..runs.targeting import TargetSpec, chooser, parse_target
from .controls import gate_checks
from .inputs import check_masks
from .outputs import GATES, finish
from .plan import Plan, make_plan, parse_methods
from .rows import layer_features
from .table import MetricInput

__all__ = ["DEFAULT_METHODS", "Plan", "evaluate"]

DEFAULT_METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam", "saliency", "inputxgradient")
"""The methods evaluated when none are named: cheap ones (one forward and one backward pass)."""

_NOT_LOGITS = (
    "camkit evaluate needs a classifier returning scores [B, classes]; the model returned {got}. "
    "Wrap the model so that it returns one score per class"
)


@dataclass
class _Run:
    """One evaluation under way: where it reads and writes, the model, the plan, the classes to explain."""

    outdir: Path
    source: Path
    dataset: Dataset
    loaded: LoadedModel
    plan: Plan
    spec: TargetSpec
    mapping: LabelMapping
    ctx: DistContext
    max_pixels: int
    save_maps: bool

    def items(self, indices: Sequence[int]) -> AuditDataset:
        """The images ``indices`` of the data, read and preprocessed for the model."""
        pre = self.loaded.preprocess
        return AuditDataset(self.dataset.records, indices, pre, pre.crop or pre.size or (0, 0),
                            self.dataset.box_regions, self.dataset.mask_regions, self.max_pixels)  # fmt: skip


def evaluate(
    data: str | os.PathLike[str], model: str | nn.Module, *, out: str | os.PathLike[str],
    methods: str | Sequence[str] = DEFAULT_METHODS, metrics: str | Sequence[str] | None = None,
    preprocess: Preprocess | None = None, weights: str | None = None, trust_pickle: bool = False,
    layer: str | None = None, target: str | int | None = "pred", region: str = "object",
    size: int | Sequence[int] | None = None, crop: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = None, std: Sequence[float] | None = None, device: str | torch.device | None = None,
    batch_size: int = 16, workers: int | None = 0, limit: int | None = None, steps: int = 20, chunk_size: int = 64,
    seed: int = 0, controls: bool = True, gates: bool = True, gate_images: int = 8,
    classes: Sequence[str] | None = None, alphabetical_classes: bool = False, max_pixels: int = 64_000_000,
    save_maps: bool = False, resume: bool = False, overwrite: bool = False, progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Rank explanation methods on a model and its data (the Python side of ``camkit evaluate``).

    Every method explains every image once, for the class picked by ``target``; the chosen
    metrics score every map, beside three controls that need no model (an edge map, a centred
    Gaussian, RandomCAM). Writes into ``out``: ``scores.csv`` (one row per image x method x
    metric), ``summary.json`` (per method and metric: mean, 95% bootstrap interval, mean rank;
    per metric: Friedman test, Nemenyi critical difference, reliability; the verdict),
    ``report.html`` (self-contained), ``gates.json``, ``run.json`` and ``parts/``.

    Args:
        data: a folder of images, a folder of class folders, or a CSV manifest, as ``camkit audit``
            reads them; the manifest's region ``region`` becomes the localisation masks.
        model: a model description (see :func:`camkit.modelload.load_model`) or an ``nn.Module``.
        out: the output folder (the audit's rules: a non-empty folder that is not a camkit run is refused).
        methods: registry keys (a list or ``"gradcam,saliency"``).
        metrics: ``None`` (the default set), ``"all"``, or names from :data:`camkit.evaluation.METRICS`.
        preprocess: a :class:`~camkit.modelload.Preprocess` to use instead of the model's own.
        weights, trust_pickle, size, crop, mean, std, device: as :func:`~camkit.modelload.load_model`.
        layer: the layer of the CAM methods (``None``: automatic).
        target: ``"pred"``, a class index, or ``"label"``.
        region: the manifest region whose boxes or masks the localisation metrics use.
        batch_size, workers: images per batch, DataLoader processes.
        limit: evaluate the first ``limit`` images only.
        steps: steps of the deletion and insertion curves; chunk_size: perturbed images per forward pass.
        seed: seeds RandomCAM, the random draws of the metrics and gates, every bootstrap.
        controls: add the three controls; gates: run the sanity gates on the first ``gate_images`` images.
        classes, alphabetical_classes, max_pixels: as :func:`camkit.audit.audit`.
        save_maps: write each map as ``maps/METHOD-HASH/NAME-HASH.npy`` (float32 [H, W] in [0, 1]; each
            name is :func:`camkit.runs.files.safe_name`'s: the stem and a short hash of the method or image key).
        resume: continue the run in ``out``; overwrite: start it afresh.
        progress: show a progress bar (rank 0).

    Returns:
        The summary written to ``summary.json``.

    Example:
        >>> import os, tempfile, numpy as np, torch, camkit
        >>> root = tempfile.mkdtemp(); os.makedirs(f"{root}/data")
        >>> rng = np.random.default_rng(0)
        >>> for i in range(4):
        ...     camkit.save_png(f"{root}/data/{i}.png", rng.integers(0, 255, (8, 8, 3), dtype=np.uint8))
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
        ...                           torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 3))
        >>> summary = camkit.evaluate(f"{root}/data", net, out=f"{root}/out", methods="gradcam,saliency", layer="1",
        ...                           metrics="deletion", size=8, device="cpu", steps=4, progress=False)
        >>> summary["methods"], summary["images"], sorted(os.listdir(f"{root}/out"))[-3:]
        (['gradcam', 'saliency', 'edge', 'centre', 'randomcam'], 4, ['run.json', 'scores.csv', 'summary.json'])
    """
    refresh_umask()
    names, spec = _checked(methods, target, batch_size, steps, chunk_size, gate_images, resume, overwrite)
    outdir, source = Path(out), Path(data)
    dataset, have_masks = _data(source, outdir, region)
    ctx, dev = DistContext.start(resolve_device(device))
    try:
        loaded = _load(model, preprocess, dev, weights, trust_pickle, size, crop, mean, std)
        plan = make_plan(names, metrics, have_masks, region, layer, controls, steps, chunk_size, seed, loaded.model)
        mapping = _label_mapping(dataset, spec, loaded, classes, alphabetical_classes)
        run = _Run(outdir, source, dataset, loaded, plan, spec, mapping, ctx, max_pixels, save_maps)
        done, corrupt = _prepare(run, gates, gate_images, resume, overwrite)
        count = len(dataset.records) if limit is None else min(limit, len(dataset.records))
        started = time.perf_counter()
        todo = _explain_all(run, count, done, gate_images if gates else 0, batch_size, workers, progress)
        return dict(ctx.broadcast(_summary(run, count, todo, corrupt, started) if ctx.main else None))
    finally:
        ctx.finish()


def _checked(methods: str | Sequence[str], target: str | int | None, batch_size: int, steps: int, chunk_size: int,
             gate_images: int, resume: bool, overwrite: bool) -> tuple[list[str], TargetSpec]:  # fmt: skip
    """The methods' keys and the target, once the settings that need no data or model are checked."""
    names = parse_methods(methods)
    spec = parse_target(target, allow=("pred", "class", "label"))
    if batch_size < 1 or steps < 1 or chunk_size < 1 or gate_images < 1:
        raise InvalidInputError("batch_size, steps, chunk_size and gate_images must be at least 1")
    if resume and overwrite:
        raise InvalidInputError("--resume continues the run in --out and --overwrite replaces it: pass one")
    return names, spec


def _data(source: Path, outdir: Path, region: str) -> tuple[Dataset, bool]:
    """The data in ``source`` (never the output folder's files), and whether it has the masks of ``region``."""
    dataset = discover(source, exclude=[outdir])
    have_masks = region in dataset.regions
    if have_masks:
        check_masks(dataset, region)
    return dataset, have_masks


def _load(model: str | nn.Module, preprocess: Preprocess | None, device: torch.device, weights: str | None,
          trust_pickle: bool, size: int | Sequence[int] | None, crop: int | Sequence[int] | None,
          mean: Sequence[float] | None, std: Sequence[float] | None) -> LoadedModel:  # fmt: skip
    """The model on ``device`` with ``preprocess`` (or its own), checked to take inputs of a fixed size."""
    loaded = load_model(model, weights, trust_pickle=trust_pickle, size=size, mean=mean, std=std, device=device,
                        crop=crop)  # fmt: skip
    if preprocess is not None:
        loaded = LoadedModel(loaded.model, preprocess, loaded.device, loaded.spec, loaded.weights,
                             loaded.categories, loaded.notes)  # fmt: skip
    warn_random_weights(loaded)
    if loaded.preprocess.size is None and loaded.preprocess.crop is None:
        raise InvalidInputError("evaluations need a fixed input size: pass --size")
    return loaded


def _label_mapping(dataset: Dataset, spec: TargetSpec, loaded: LoadedModel, classes: Sequence[str] | None,
                   alphabetical: bool) -> LabelMapping:  # fmt: skip
    """The images' labels as output indices; unlabelled images when the labels cannot be mapped and are not needed."""
    try:
        return map_labels([r.label for r in dataset.records], classes=classes, model_classes=loaded.categories,
                          alphabetical=alphabetical)  # fmt: skip
    except LabelMappingError:
        if spec.kind == "label":
            raise
        # the labels are only read for --target label: without a mapping, the images are unlabelled
        return LabelMapping([-1] * len(dataset.records), None, "none")


def _config(run: _Run, gates: bool, gate_images: int) -> dict[str, Any]:
    """The settings written to ``run.json``; ``resume`` refuses a run whose settings differ."""
    loaded, plan = run.loaded, run.plan
    return {
        "command": "evaluate", "data": str(run.source.resolve()), "model": loaded.spec, "weights": loaded.weights,
        "weights_sha256": loaded.weights_sha256(), "methods": plan.methods, "layer": plan.layer,
        "metrics": [m.name for m in plan.metrics], "target": str(run.spec), "region": plan.region,
        "preprocess": loaded.preprocess.describe(), "steps": plan.steps, "seed": plan.seed, "gates": gates,
        "gate_images": gate_images, "label_mapping": run.mapping.describe(), "max_pixels": run.max_pixels,
        "save_maps": run.save_maps,
    }  # fmt: skip


def _prepare(run: _Run, gates: bool, gate_images: int, resume: bool, overwrite: bool) -> tuple[set[str], list[str]]:
    """The output folder made ready (:func:`camkit.runs.outdir.prepare_out`); with ``resume``, what is done already.

    Returns the keys of the images done and the part files found corrupt (their images are redone).
    """
    prepare_out(run.outdir, _config(run, gates, gate_images), resume=resume, overwrite=overwrite, ctx=run.ctx)
    return finished_keys(run.outdir, run.ctx) if resume else (set(), [])


def _explain_all(run: _Run, count: int, done: set[str], gate_images: int, batch_size: int, workers: int | None,
                 progress: bool) -> list[int]:  # fmt: skip
    """The gates (``gate_images`` > 0, once per output folder), then this rank's share of the images not ``done``.

    Returns the positions of the images this run explains (all ranks together).
    """
    ctx, records = run.ctx, run.dataset.records
    if gate_images and ctx.main and not (run.outdir / GATES).is_file():
        _run_gates(run, run.items(range(count)), gate_images)
    todo = [i for i in range(count) if records[i].key not in done]
    session = ctx.broadcast(f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}")
    loader = make_loader(run.items(todo[ctx.rank :: ctx.world]), batch_size, workers or 0, run.loaded.device)
    _loop(run, loader, session, len(todo), progress)
    ctx.barrier()
    return todo


def _summary(run: _Run, count: int, todo: list[int], corrupt: list[str], started: float) -> dict[str, Any]:
    """Rank 0: merge the parts of the first ``count`` images into the outputs; the summary."""
    plan = run.plan
    meta = {"model": run.loaded.describe(), "data": {"path": str(run.source), "kind": run.dataset.kind},
            "region": plan.region, "target": str(run.spec), "layer": plan.layer, "seed": plan.seed,
            "steps": plan.steps, "world_size": run.ctx.world, "images_this_run": len(todo),
            "corrupt_parts_redone": corrupt, "seconds": round(time.perf_counter() - started, 3),
            "seconds_rank0": {k: round(v, 3) for k, v in plan.seconds.items()}}  # fmt: skip
    return finish(run.outdir, [r.key for r in run.dataset.records[:count]], plan, meta)


def _batch_inputs(batch: dict[str, Any], loaded: LoadedModel, spec: Any, labels: Sequence[int], dataset: Dataset,
                  region: str | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None, list[int]]:  # fmt: skip
    """The valid images of a batch: inputs, logits, the explained classes, region masks, positions."""
    ok = [i for i, e in enumerate(batch["error"]) if not e]
    x = batch["x"][ok].to(loaded.device)
    with torch.no_grad(), eval_mode(loaded.model):
        logits = loaded.model(x) if ok else torch.zeros(0, 1)
    logits = check_logits(logits, _NOT_LOGITS)
    index = batch["index"][ok]
    known = torch.tensor([labels[int(i)] for i in index], dtype=torch.long)
    target = chooser(spec, known)(logits.float()).to(loaded.device)
    masks = None
    if region is not None and ok:
        if region in dataset.box_regions:
            boxes = batch["boxes"][ok, dataset.box_regions.index(region)]
            masks = region_masks(boxes, torch.zeros(x.shape[0], *x.shape[2:]))
        else:
            r = dataset.mask_regions.index(region)
            masks = batch["masks"][ok, r] & batch["mask_present"][ok, r][:, None, None]
        masks = masks.to(loaded.device)
    return x, logits, target, masks, ok


def _explain(explainer: Callable[[Tensor, Tensor], Tensor], x: Tensor, target: Tensor, name: str) -> Tensor:
    maps = explainer(x, target)
    if not isinstance(maps, Tensor) or tuple(maps.shape) != (x.shape[0], *x.shape[2:]):
        got = list(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise InvalidInputError(f"method {name!r} returned maps {got}, expected {[x.shape[0], *x.shape[2:]]}")
    return maps.detach().float()


def _loop(run: _Run, loader: Any, session: str, total: int, progress: bool) -> None:
    """Explain and score every batch of ``loader``; each batch's rows go to ``parts/`` (``session``: this run's name)."""
    from tqdm import tqdm

    plan, loaded, ctx, dataset, out = run.plan, run.loaded, run.ctx, run.dataset, run.outdir
    spec, labels = run.spec, run.mapping.indices
    generator = torch.Generator().manual_seed(plan.seed + 1000 * ctx.rank)
    seconds = plan.seconds
    explainers = {name: plan.factories[name](loaded.model) for name in plan.methods}
    features = layer_features(loaded.model, plan.layer)  # resolved on first use only
    with tqdm(total=total, unit="img", disable=not (progress and ctx.main), dynamic_ncols=True,
              desc="evaluate" if ctx.world == 1 else f"evaluate (rank 0 of {ctx.world})") as bar:  # fmt: skip
        for seq, batch in enumerate(loader):
            x, logits, target, masks, ok = _batch_inputs(batch, loaded, spec, labels, dataset, plan.region)
            scores: dict[str, dict[str, Tensor]] = {}
            maps_of: dict[str, Tensor] = {}
            for name in plan.methods if ok else []:
                tic = time.perf_counter()
                maps = _explain(explainers[name], x, target, name)
                seconds[f"explain.{name}"] = seconds.get(f"explain.{name}", 0.0) + time.perf_counter() - tic
                maps_of[name] = maps
                scores[name] = {}
                for metric in plan.metrics:
                    tic = time.perf_counter()
                    view = MetricInput(loaded.model, x, maps, target, masks, generator, plan.steps, plan.chunk_size,
                                       explainers[name], plan.factories[name], features)  # fmt: skip
                    scores[name][metric.name] = metric.compute(view).detach().float().cpu()
                    seconds[f"metric.{metric.name}"] = seconds.get(f"metric.{metric.name}", 0.0) + time.perf_counter() - tic
            rows = _rows(batch, dataset, ok, logits, target, scores)
            if run.save_maps:
                _save_maps(out, maps_of, [dataset.records[int(batch["index"][i])].key for i in ok])
            text = "".join(json.dumps(r) + "\n" for r in rows)
            atomic_write(out / "parts" / f"{session}-r{ctx.rank:03d}-{seq:06d}.jsonl", text, sync=True)
            bar.update(len(rows) * ctx.world)


def _rows(batch: dict[str, Any], dataset: Dataset, ok: list[int], logits: Tensor, target: Tensor,
          scores: dict[str, dict[str, Tensor]]) -> list[dict[str, Any]]:  # fmt: skip
    probs = logits.float().softmax(dim=1).cpu()
    target_list = target.cpu().tolist()
    position = {b: j for j, b in enumerate(ok)}
    table = {m: {k: v.tolist() for k, v in per.items()} for m, per in scores.items()}
    rows = []
    for b in range(len(batch["error"])):
        record = dataset.records[int(batch["index"][b])]
        row: dict[str, Any] = {"key": record.key, "label": record.label, "error": batch["error"][b]}
        if b in position:
            j = position[b]
            row["target"] = int(target_list[j])
            row["confidence"] = float(probs[j, target_list[j]])
            row["scores"] = {m: {k: (None if v[j] != v[j] else v[j]) for k, v in per.items()} for m, per in table.items()}
        rows.append(row)
    return rows


def _save_maps(out: Path, maps_of: dict[str, Tensor], keys: list[str]) -> None:
    for method, maps in maps_of.items():
        folder = out / "maps" / safe_name(method, "")
        folder.mkdir(parents=True, exist_ok=True)
        for key, m in zip(keys, maps.cpu().numpy().astype(np.float32)):
            buffer = io.BytesIO()
            np.save(buffer, m)
            atomic_write(folder / safe_name(key, ".npy"), buffer.getvalue())


def _run_gates(run: _Run, items: AuditDataset, gate_images: int) -> None:
    """The sanity gates of every method on the first ``gate_images`` readable images; writes ``gates.json``."""
    plan, loaded = run.plan, run.loaded
    picked = []
    for i in range(len(items)):
        item = items[i]
        if not item["error"]:
            picked.append(item)
        if len(picked) == gate_images:
            break
    if not picked:
        raise AuditError("no image of the data could be read; see the errors with camkit audit")
    batch = torch.utils.data.default_collate(picked)
    x, logits, target, _, _ = _batch_inputs(batch, loaded, run.spec, run.mapping.indices, run.dataset, None)
    tic = time.perf_counter()
    result = {name: gate_checks(plan.factories[name], loaded.model, x, target, logits.shape[1], seed=plan.seed)
              for name in plan.methods}  # fmt: skip
    plan.seconds["gates"] = time.perf_counter() - tic
    atomic_write(run.outdir / GATES, json.dumps({"images": len(picked), "gates": result}, indent=1), sync=True)
