"""Train the demo's :class:`~camkit.bundled.model.ShapesCNN` on the watermarked shapes dataset.

Seeded end to end; on a CPU it takes a few minutes::

    python -m camkit.demo.train --out camkit/assets/shapes_cnn.pt
    python -m camkit.demo.train --model vit --epochs 8 --lr 1e-3 --out camkit/assets/shapes_vit.pt

It writes the state dict to ``--out`` and, next to it, a JSON file (same name, ``.json``)
with the settings and the accuracies measured by :func:`evaluate` on freshly generated
test images: clean (no watermark), marked (the training distribution) and swapped (the
watermark on every other class, none on the marker class).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..bundled.model import ShapesCNN
from ..bundled.shapes import CLASSES, MARKER_CLASS, make_split, to_batch
from ..bundled.vit import shapes_vit

__all__ = ["TEST_SEED", "TRAIN_SEED", "evaluate", "main", "train"]

TRAIN_SEED = 0
TEST_SEED = 1


@torch.no_grad()
def _predict(model: nn.Module, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    return torch.cat([model(x[i : i + batch_size]).argmax(dim=1) for i in range(0, x.shape[0], batch_size)])


def evaluate(model: nn.Module, n: int = 800, seed: int = TEST_SEED) -> dict[str, Any]:
    """Accuracies of ``model`` on the ``clean``, ``marked`` and ``swapped`` splits of ``n`` images each.

    Returns a dict with, per split, ``"<split>"`` (overall accuracy), ``"<split>_per_class"``
    (a class name -> accuracy mapping) and ``"<split>_as_marker"`` (share of the images *not*
    of the marker class predicted as the marker class). The model is put in eval mode.

    Example:
        >>> from camkit.bundled.model import ShapesCNN
        >>> from camkit.demo.train import evaluate
        >>> sorted(evaluate(ShapesCNN(), n=8))[:3]
        ['clean', 'clean_as_marker', 'clean_per_class']
    """
    model.eval()
    device = next(model.parameters()).device
    marker = CLASSES.index(MARKER_CLASS)
    report: dict[str, Any] = {}
    for split in ("clean", "marked", "swapped"):
        x, y = to_batch(make_split(split, n, seed))
        pred = _predict(model, x.to(device)).cpu()
        report[split] = round(float((pred == y).float().mean()), 4)
        report[f"{split}_per_class"] = {
            name: round(float((pred[y == c] == c).float().mean()), 4) for c, name in enumerate(CLASSES)
        }
        report[f"{split}_as_marker"] = round(float((pred[y != marker] == marker).float().mean()), 4)
    return report


def train(
    n_train: int = 4000,
    epochs: int = 8,
    seed: int = TRAIN_SEED,
    batch_size: int = 64,
    lr: float = 5e-3,
    build: Callable[[], nn.Module] = ShapesCNN,
) -> nn.Module:
    """Train a :class:`ShapesCNN` (or ``build()``'s model) from scratch on ``n_train`` images of the ``train`` split.

    Adam with a one-cycle learning-rate schedule; weights, shuffling and data all follow ``seed``.
    """
    torch.manual_seed(seed)
    x, y = to_batch(make_split("train", n_train, seed))
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * ((n_train + batch_size - 1) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    order = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(epochs):
        perm = torch.randperm(n_train, generator=order)
        total, correct, seen = 0.0, 0, 0
        for i in range(0, n_train, batch_size):
            idx = perm[i : i + batch_size]
            logits = model(x[idx])
            loss = F.cross_entropy(logits, y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == y[idx]).sum())
            seen += len(idx)
        print(f"epoch {epoch + 1}/{epochs}: loss {total / seen:.4f}, train accuracy {correct / seen:.4f}", flush=True)
    return model.eval()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m camkit.demo.train", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the state dict (.pt); a .json goes next to it")
    parser.add_argument("--train", type=int, default=4000, help="training images (default: 4000)")
    parser.add_argument("--epochs", type=int, default=8, help="epochs (default: 8)")
    parser.add_argument("--seed", type=int, default=TRAIN_SEED, help=f"seed (default: {TRAIN_SEED})")
    parser.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (default: 5e-3)")
    parser.add_argument("--test", type=int, default=800, help="test images per split (default: 800)")
    parser.add_argument("--model", choices=("cnn", "vit"), default="cnn", help="the demo CNN or the demo ViT")
    parser.add_argument("--batch-size", type=int, default=64, help="images per step (default: 64)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    build = shapes_vit if args.model == "vit" else ShapesCNN
    model = train(args.train, args.epochs, args.seed, batch_size=args.batch_size, lr=args.lr, build=build)
    report = evaluate(model, args.test)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tmp = out.with_name(f".{out.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, out)
    meta = {"model": args.model, "batch_size": args.batch_size, "train": args.train, "epochs": args.epochs, "seed": args.seed, "lr": args.lr, "test": args.test, **report}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
