"""The demo's finding without masks: the circles' watermark strategy, checked against the generator.

``camkit demo`` audits the same images a third time from a manifest with no regions (paths and
labels only). The audit's strategies (:mod:`camkit.audit.strategies`) rank first a map strategy
whose images all look at one place; :func:`strategy_finding` takes that strategy with the other
strategies of its class that look at the same place (their mean maps peak within a tenth of the
image), and measures what only the generator knows: how many of their images carry the
watermark, and the model's accuracy on the same images drawn again without it.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["plain_manifest", "strategy_finding"]


def plain_manifest(manifest: Path) -> Path:
    """A copy of a demo manifest with only ``path`` and ``label`` (no regions), beside it: ``plain.csv``."""
    with open(manifest, newline="") as handle:
        rows = list(csv.DictReader(handle))
    plain = manifest.with_name("plain.csv")
    with open(plain, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        writer.writerows([r["path"], r["label"]] for r in rows)
    return plain


def _place(peak: list[float]) -> str:
    rows, cols = peak
    vertical = "top" if rows < 1 / 3 else "bottom" if rows > 2 / 3 else "middle"
    horizontal = "left" if cols < 1 / 3 else "right" if cols > 2 / 3 else "centre"
    return "centre" if (vertical, horizontal) == ("middle", "centre") else f"{vertical}-{horizontal}"


def strategy_finding(summary: Mapping[str, Any], audit_dir: Path, data: Path, model: Any, seed: int) -> dict[str, Any]:
    """The top-ranked map strategy's class and place, its images, their accuracy with and without the watermark.

    Returns figures (fractions) ``strategy.size`` (images), ``strategy.share`` (of the class),
    ``strategy.accuracy``, ``strategy.unmarked_accuracy`` (the same images rendered again without
    the watermark), ``strategy.purity`` (share of its images that carry the watermark) and
    ``strategy.recall`` (share of the class's watermarked images it holds), with ``strategy.names``,
    ``strategy.prototypes`` and the printed ``strategy_finding`` line.
    """
    import torch

    from ..bundled.shapes import CLASSES, render, to_batch

    section = summary["strategies"]
    top = next(r for r in section["ranking"] if r["kind"] == "maps")
    cls = top["name"].rsplit("/", 1)[0]
    group = section["maps"][cls]["per_strategy"]
    same = [s for s in group if s["peak"] and max(abs(a - b) for a, b in zip(s["peak"], top["peak"])) <= 0.1]
    names = [s["name"] for s in same]
    with open(audit_dir / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    with open(data / "manifest.csv", newline="") as handle:
        marked = {r["path"]: r["marked"] == "1" for r in csv.DictReader(handle)}
    members = [r for r in rows if r["strategy"] in names]
    in_class = [r for r in rows if r["label"] == cls]
    index = [int(Path(r["key"]).name.split("_")[0]) for r in members]
    label = CLASSES.index(cls)
    x, y = to_batch([render(seed, i, label, False) for i in index])
    with torch.no_grad():
        unmarked = (model.eval()(x).argmax(dim=1) == y).float().mean() if len(index) else torch.tensor(float("nan"))
    hits = sum(marked.get(r["key"], False) for r in members)
    total_marked = sum(marked.get(r["key"], False) for r in in_class)
    prototypes = [p for s in same for p in s["prototypes"]][:4]
    figures: dict[str, Any] = {
        "strategy.names": names,
        "strategy.size": len(members),
        "strategy.share": len(members) / max(1, len(in_class)),
        "strategy.accuracy": sum(r["correct"] == "1" for r in members) / max(1, len(members)),
        "strategy.unmarked_accuracy": float(unmarked),
        "strategy.purity": hits / max(1, len(members)),
        "strategy.recall": hits / max(1, total_marked),
        "strategy.prototypes": prototypes,
    }
    figures["strategy_finding"] = (
        f"finding without masks: class {cls!r}: strategies {', '.join(names)} ({len(members)} of {len(in_class)} images) "
        f"look at one place, the {_place(top['peak'])}; accuracy {figures['strategy.accuracy']:.0%}, "
        f"{figures['strategy.unmarked_accuracy']:.0%} on the same images without the watermark; "
        f"prototypes: {', '.join(Path(p).name for p in prototypes)}"
    )
    return figures
