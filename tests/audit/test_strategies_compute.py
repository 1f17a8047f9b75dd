"""The strategies' arithmetic: k-means, neighbours, PCA, threads, devices, and what they import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from camkit.audit.strategies import spectral_clusters
from camkit.audit.strategies.kmeans import kmeans
from camkit.audit.strategies.spectral import _nearest, nearest, prepare_features
from camkit.errors import InvalidInputError


def _blobs(counts: tuple[int, ...], dims: int, seed: int, spread: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = 5 * np.eye(len(counts), dims)
    truth = np.repeat(np.arange(len(counts)), counts)
    return (centres[truth] + rng.normal(0, spread, (len(truth), dims))).astype(np.float32), truth


def test_kmeans_is_seeded_and_finds_separated_groups():
    points, truth = _blobs((30, 20, 10), 3, seed=0)
    a = kmeans(torch.from_numpy(points), 3, seed=4)
    b = kmeans(torch.from_numpy(points), 3, seed=4)
    assert torch.equal(a, b) and a.dtype == torch.int64 and a.shape == (60,)
    for group in range(3):  # each planted group is one cluster, and the three clusters differ
        assert len(set(a[truth == group].tolist())) == 1
    assert len({int(a[truth == g][0]) for g in range(3)}) == 3


def test_kmeans_keeps_the_start_with_the_lowest_inertia():
    # by hand: {0, 0.1, 1, 1.1} and {10} has inertia 1.01; every other split of k=2 is above 50
    pts = torch.tensor([[0.0], [0.1], [1.0], [1.1], [10.0]])
    for seed in range(4):
        labels = kmeans(pts, 2, n_init=5, seed=seed)
        assert labels[:4].unique().numel() == 1 and labels[4] != labels[0]


def test_kmeans_refuses_a_k_it_cannot_give():
    with pytest.raises(InvalidInputError, match="1 <= k <= 2"):
        kmeans(torch.zeros(2, 2), 3)


def test_nearest_in_blocks_equals_brute_force():
    rng = np.random.default_rng(1)
    base, query = rng.normal(size=(40, 5)).astype(np.float32), rng.normal(size=(23, 5)).astype(np.float32)
    brute = np.argsort(((query[:, None] - base[None]) ** 2).sum(-1), axis=1, kind="stable")[:, :4]
    assert np.array_equal(nearest(query, base, 4), brute)
    x = torch.from_numpy(base)
    blocked = _nearest(x, x, 3, skip_self=True, block=7)
    d = torch.cdist(x, x).fill_diagonal_(float("inf"))
    assert torch.equal(blocked, d.topk(3, dim=1, largest=False).indices)
    assert not (blocked == torch.arange(40)[:, None]).any()  # never its own neighbour


def test_pca_keeps_every_distance_of_rows_in_a_low_dimensional_subspace():
    rng = np.random.default_rng(2)
    rows = (rng.normal(size=(80, 20)) @ rng.normal(size=(20, 100))).astype(np.float32)  # rank 20 < 32 dims
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    reduced = prepare_features(rows, seed=3)
    assert reduced.shape == (80, 32)
    before = np.linalg.norm(unit[:, None] - unit[None], axis=-1)
    after = np.linalg.norm(reduced[:, None] - reduced[None], axis=-1)
    np.testing.assert_allclose(after, before, atol=2e-5)


def test_spectral_clusters_restore_torch_threads_and_leave_inputs_alone():
    feats, truth = _blobs((40, 25), 40, seed=5, spread=0.3)
    copy = feats.copy()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        c = spectral_clusters(feats, seed=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(feats, copy)
    assert c.count == 2 and np.array_equal(c.labels, truth)  # the larger group is strategy 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_spectral_clusters_on_cuda_equal_the_cpu():
    feats, _ = _blobs((800, 500, 300), 64, seed=6, spread=0.5)  # above 1,500 images: clustered on the device
    cpu = spectral_clusters(feats, seed=0)
    gpu = spectral_clusters(feats, seed=0, device="cuda")
    assert gpu.count == cpu.count and np.array_equal(gpu.labels, cpu.labels)
    np.testing.assert_allclose(gpu.eigenvalues, cpu.eigenvalues, atol=1e-4)


@pytest.mark.heavy
def test_a_class_above_the_sample_follows_its_sampled_neighbours():
    from camkit.audit.strategies.spectral import SAMPLE

    feats, truth = _blobs((SAMPLE // 2 + 300, SAMPLE // 2), 8, seed=7, spread=0.4)
    c = spectral_clusters(feats, seed=0)
    assert c.count == 2 and np.array_equal(c.labels, truth)
    assert c.embedding.shape == (len(truth), 2)


def test_small_classes_import_neither_scikit_learn_nor_scipy():
    code = (
        "import sys, numpy as np\n"
        "from camkit.audit.strategies import find_strategies\n"
        "rng = np.random.default_rng(0)\n"
        "found = find_strategies(['a'] * 60, rng.uniform(0, 1, (60, 4, 4)), rng.normal(size=(60, 40)))\n"
        "print(len(found.maps['a'].strategies) >= 1, sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "True []"


def _reference_kmeans(points: torch.Tensor, k: int, n_init: int = 3, seed: int = 0) -> torch.Tensor:
    """k-means as written before its starts were batched: one start after the other, ``torch.cdist`` per step."""
    x = points.to(torch.float64)
    gen = torch.Generator().manual_seed(seed)
    tol = 1e-4 * float(x.var(dim=0, unbiased=False).mean())
    best, least = None, float("inf")
    for _ in range(n_init):
        first = int(torch.randint(len(x), (1,), generator=gen))
        centres, closest = [x[first]], ((x - x[first]) ** 2).sum(dim=1)
        for _ in range(1, k):
            total = float(closest.sum())
            trials = 2 + int(np.log(k))
            pick = (torch.multinomial(closest / total, trials, replacement=True, generator=gen) if total > 0
                    else torch.randint(len(x), (trials,), generator=gen))  # fmt: skip
            candidate = torch.minimum(closest[None], torch.cdist(x[pick], x) ** 2)
            chosen = int(torch.argmin(candidate.sum(dim=1)))
            centres.append(x[pick[chosen]])
            closest = candidate[chosen]
        c = torch.stack(centres)
        labels = torch.cdist(x, c).argmin(dim=1)
        for _ in range(300):
            counts = torch.bincount(labels, minlength=k).to(x.dtype)[:, None]
            moved = torch.where(counts > 0, torch.zeros_like(c).index_add_(0, labels, x) / counts.clamp_min(1), c)
            shift, c = float(((moved - c) ** 2).sum()), moved
            new = torch.cdist(x, c).argmin(dim=1)
            stop, labels = bool(torch.equal(new, labels) or shift <= tol), new
            if stop:
                break
        inertia = float(((x - c[labels]) ** 2).sum())
        if inertia < least:
            best, least = labels, inertia
    assert best is not None
    return best


def _embedding_rows(rng: np.random.Generator, n: int, k: int) -> torch.Tensor:
    """Unit rows of k overlapping groups, like a spectral embedding's rows (noise from tight to none at all)."""
    group = rng.integers(0, k, n)
    rows = rng.normal(size=(k, k))[group] + rng.uniform(0.05, 0.8) * rng.normal(size=(n, k))
    return torch.from_numpy(rows / np.linalg.norm(rows, axis=1, keepdims=True))


def test_kmeans_equals_the_one_start_at_a_time_reference():
    rng = np.random.default_rng(11)
    for trial in range(12):
        n, k = int(rng.integers(12, 200)), int(rng.integers(2, 7))
        points = _embedding_rows(rng, n, k)
        assert torch.equal(kmeans(points, k, seed=trial % 4), _reference_kmeans(points, k, seed=trial % 4)), (n, k)
    ties = torch.tensor([[0.0, 0.0]] * 6 + [[1.0, 0.0]] * 6 + [[0.5, 0.0]])  # repeated points, one equidistant
    assert torch.equal(kmeans(ties, 2, n_init=4, seed=1), _reference_kmeans(ties, 2, n_init=4, seed=1))


def test_find_strategies_equal_with_the_reference_kmeans(monkeypatch):
    from camkit.audit.strategies import find_strategies, spectral

    rng = np.random.default_rng(12)
    sizes = (40, 50, 90, 160)
    maps = np.concatenate([_blobs((s // 2, s // 4, s - s // 2 - s // 4), 64, seed=s, spread=0.8)[0] for s in sizes])
    vectors = np.abs(rng.normal(size=(sum(sizes), 48))).astype(np.float32)
    vectors[: sizes[0] // 2, :8] += 3.0
    classes = [f"c{i}" for i, s in enumerate(sizes) for _ in range(s)]
    right = [bool(i % 3) for i in range(len(classes))]

    def summary() -> list[object]:
        found = find_strategies(classes, np.abs(maps).reshape(-1, 8, 8), vectors, correct=right, seed=2)
        groups = [*found.maps.values(), *found.concepts.values()]
        return [[(g.clustering.labels.tolist(), g.outliers, [(s.members, s.prototypes, s.channels) for s in g.strategies])
                 for g in groups], [(kind, s.name, s.score) for kind, s in found.ranking]]  # fmt: skip

    ours = summary()
    monkeypatch.setattr(spectral, "kmeans", lambda points, k, n_init=3, seed=0: _reference_kmeans(points, k, n_init, seed))
    assert summary() == ours
    assert any(len(set(labels)) > 1 for labels, _, _ in ours[0])  # k-means ran on some class
