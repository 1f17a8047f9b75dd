"""Strategies found without masks: planted shortcuts recovered by the map and the concept strategies, in audits."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from torch import nn

import camkit
from camkit.audit.strategies import find_strategies, spectral_clusters

SIZE = 24


def _images(n: int, seed: int, shortcut: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Class 0: a vertical bar, class 1: a horizontal bar, both at random places on noise.

    A third of class 1 carries no bar but a shortcut: ``"tag"`` a green square in the top-left
    corner (always there), ``"patch"`` a red square at a random place. Returns (x, y, shortcut?).
    """
    g = torch.Generator().manual_seed(seed)
    x = 0.15 * torch.rand(n, 3, SIZE, SIZE, generator=g)
    y = torch.arange(n) % 2
    cut = torch.zeros(n, dtype=torch.bool)
    for i in range(n):
        p = int(torch.randint(3, SIZE - 5, (1,), generator=g))
        q = int(torch.randint(3, SIZE - 12, (1,), generator=g))
        if y[i] == 1 and i % 6 == 1:
            cut[i] = True
            if shortcut == "tag":
                x[i, 1, 1:5, 1:5] = 1.0
            else:
                r, c = (int(v) for v in torch.randint(2, SIZE - 6, (2,), generator=g))
                x[i, 0, r : r + 4, c : c + 4] = 1.0
        elif y[i] == 0:
            x[i, :, q : q + 10, p : p + 2] = 0.9
        else:
            x[i, :, p : p + 2, q : q + 10] = 0.9
    return x, y, cut


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        )  # fmt: skip
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.amax(self.features(x), dim=(2, 3)))


_TRAINED: dict[str, SmallNet] = {}


def _trained(shortcut: str) -> SmallNet:
    """A SmallNet trained for a few seconds on ``_images(.., shortcut)`` (cached per session)."""
    if shortcut not in _TRAINED:
        net = SmallNet()
        x, y, _ = _images(480, 0, shortcut)
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1)
        for _ in range(150):
            idx = torch.randint(0, len(x), (64,), generator=g)
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        _TRAINED[shortcut] = net.eval().requires_grad_(False)
    return _TRAINED[shortcut]


def _purity(members: list[int], truth: np.ndarray) -> tuple[float, float]:
    """(share of the strategy's images that carry the shortcut, share of the shortcut images it holds)."""
    inside = truth[members]
    return float(inside.mean()), float(inside.sum() / truth.sum())


def test_spectral_clusters_are_seeded_and_sorted_by_size():
    rng = np.random.default_rng(3)
    feats = np.concatenate([rng.normal([4, 0, 0, 0], 0.2, (40, 4)), rng.normal([0, 4, 0, 0], 0.2, (15, 4))])
    a = spectral_clusters(feats, seed=5)
    b = spectral_clusters(feats, seed=5)
    assert a.count == 2 and np.array_equal(a.labels, b.labels)
    assert a.labels[:40].tolist() == [0] * 40 and a.labels[40:].tolist() == [1] * 15
    assert a.embedding.shape == (55, 2) and a.eigenvalues[0] == pytest.approx(0, abs=1e-9)


def test_too_small_class_gets_one_strategy_and_says_why():
    maps = np.random.default_rng(0).uniform(0, 1, (30, 4, 4))
    found = find_strategies(["a"] * 25 + ["b"] * 5, maps, min_images=12)
    assert len(found.maps["b"].strategies) == 1
    assert found.maps["b"].reason == "5 images: strategies need at least 12"
    assert found.names("maps")[25:] == ["b/0"] * 5
    assert found.maps["b"].strategies[0].size == 5


@pytest.mark.heavy
def test_map_strategies_find_a_fixed_tag():
    net = _trained("tag")
    x, y, cut = _images(180, 7, "tag")
    assert bool((net(x).argmax(1) == y).float().mean() > 0.9)
    maps = camkit.GradCAM(net, "features.4")(x, y)
    from camkit.audit.strategies.store import downsample_maps

    small = downsample_maps(maps).float().numpy()
    found = find_strategies([str(int(c)) for c in y], small, correct=[True] * len(y), seed=0)
    kind, top = found.ranking[0]
    assert kind == "maps" and top.name.startswith("1/")
    purity, recall = _purity(top.members, cut.numpy())
    print(f"map strategy {top.name}: purity {purity:.2f}, recall {recall:.2f}")
    assert purity >= 0.9 and recall >= 0.9
    assert top.coherence is not None and top.coherence > 0.98  # every tagged image looks at the same corner
    # the tagged images' mean map peaks in the top-left quarter
    peak = np.unravel_index(int(np.argmax(top.mean_map)), top.mean_map.shape)
    assert peak[0] < 8 and peak[1] < 8


@pytest.mark.heavy
def test_concept_strategies_find_a_patch_at_random_places():
    net = _trained("patch")
    x, y, cut = _images(180, 8, "patch")
    assert bool((net(x).argmax(1) == y).float().mean() > 0.9)
    vectors = camkit.ConceptRelevance(net, "features.4").relevance(x, y).numpy()
    found = find_strategies([str(int(c)) for c in y], vectors=vectors, seed=0)
    group = found.concepts["1"]
    assert len(group.strategies) >= 2
    best = max(group.strategies, key=lambda s: _purity(s.members, cut.numpy())[0])
    purity, recall = _purity(best.members, cut.numpy())
    print(f"concept strategy {best.name}: purity {purity:.2f}, recall {recall:.2f}")
    assert purity >= 0.9 and recall >= 0.9
    assert best.channels and best.references[best.channels[0][0]]
    # the channels that set it apart carry more of the patch images' relevance than of the others'
    ch = best.channels[0][0]
    share = vectors / np.abs(vectors).sum(1, keepdims=True)  # each channel's signed share, as the lift is computed
    others = (y == 1).numpy() & ~cut.numpy()
    assert share[cut.numpy(), ch].mean() > share[others, ch].mean() + 0.05
    assert best.channels[0][1] > 0.05


def _write_data(root, n: int, seed: int):
    x, y, cut = _images(n, seed, "tag")
    rows = []
    (root / "img").mkdir(parents=True)
    for i in range(n):
        rgb = (x[i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        camkit.save_png(root / "img" / f"{i:03d}.png", rgb)
        rows.append([f"img/{i:03d}.png", "ab"[int(y[i])], 1, 1, 5, 5])
    with open(root / "data.csv", "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["path", "label", "tag_x0", "tag_y0", "tag_x1", "tag_y1"])
        w.writerows(rows)
    return cut


@pytest.mark.slow
def test_audit_with_masks_strategies_and_resume(tmp_path):
    net = _trained("tag")
    cut = _write_data(tmp_path, 96, 9)
    common = dict(model=net, layer="features.4", size=SIZE, mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu",
                  batch_size=16, workers=0, classes=["a", "b"], progress=False)  # fmt: skip
    full = camkit.audit(tmp_path / "data.csv", out=tmp_path / "full", **common)
    camkit.audit(tmp_path / "data.csv", out=tmp_path / "half", limit=40, **common)
    resumed = camkit.audit(tmp_path / "data.csv", out=tmp_path / "half", resume=True, **common)
    with open(tmp_path / "full" / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    with open(tmp_path / "half" / "results.csv") as handle:
        again = list(csv.DictReader(handle))
    assert [r["strategy"] for r in rows] == [r["strategy"] for r in again]  # resume keeps and completes them
    assert [r["concept_strategy"] for r in rows] == [r["concept_strategy"] for r in again]
    assert all(r["strategy"].startswith(r["label"] + "/") for r in rows)
    assert "energy_tag" in rows[0]  # masks and strategies together
    section = full["strategies"]
    assert section == resumed["strategies"]
    kind, top = section["ranking"][0]["kind"], section["ranking"][0]
    assert kind == "maps" and top["name"].startswith("b/")
    members = [i for i, r in enumerate(rows) if r["strategy"] == top["name"]]
    purity, recall = _purity(members, cut.numpy())
    assert purity >= 0.9 and recall >= 0.9
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["strategies"]["maps"]["b"]["per_strategy"][0]["prototypes"]
    html = (tmp_path / "full" / "report.html").read_text()
    assert "Strategies (found without masks)" in html and "<svg" in html and "Class b" in html


def test_audit_strategies_small_and_off(tmp_path):
    net = _trained("tag")
    _write_data(tmp_path, 10, 11)
    common = dict(model=net, layer="features.4", size=SIZE, mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu",
                  batch_size=4, workers=0, classes=["a", "b"], progress=False)  # fmt: skip
    summary = camkit.audit(tmp_path / "data.csv", out=tmp_path / "on", **common)
    section = summary["strategies"]
    assert section["maps"]["a"]["reason"] == "5 images: strategies need at least 12"
    assert section["concepts"]["b"]["strategies"] == 1
    with open(tmp_path / "on" / "results.csv") as handle:
        assert {r["strategy"] for r in csv.DictReader(handle)} == {"a/0", "b/0"}
    assert sorted(p.suffix for p in (tmp_path / "on" / "parts").iterdir()) == [".jsonl"] * 3 + [".npz"] * 3
    off = camkit.audit(tmp_path / "data.csv", out=tmp_path / "off", strategies=False, **common)
    assert "strategies" not in off
    with open(tmp_path / "off" / "results.csv") as handle:
        assert "strategy" not in next(csv.reader(handle))
    assert not list((tmp_path / "off" / "parts").glob("*.npz"))
