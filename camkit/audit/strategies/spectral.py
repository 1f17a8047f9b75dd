"""Spectral clustering of one class's images (SpRAy's core): a kNN graph, its embedding, the eigengap.

Features [N, D] (downsampled maps or concept relevance vectors) are scaled to unit length,
reduced to at most :data:`PCA_DIMS` dimensions (a seeded randomized PCA), joined into a
symmetric k-nearest-neighbour graph, and the graph's normalised Laplacian gives the spectral
embedding. The number of clusters is where the Laplacian's smallest eigenvalues first jump (the
eigengap: the first gap at least half the largest); k-means on the embedding's rows then
assigns the images. Everything is seeded: the same features give the same clusters.

The arithmetic is torch's, for a class of more than ``_DENSE`` images on the device asked for
(float32 matrix products; the eigenproblem in float64): the graph is built on at most
:data:`SAMPLE` images, so it is a dense matrix of at most 64 MB, and neighbours are searched in blocks of rows, so memory stays bounded whatever the
number of images. On the CPU a class is clustered on one intra-op thread (torch's setting is
restored after): its operations are small, so handing them to more threads costs more than it
saves, and on a busy machine the threads only wait for each other. The eigenproblem is solved
densely up to ``_DENSE`` images on the CPU (SciPy's sparse Lanczos solver above) and densely on a
GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ...errors import InvalidInputError
from .kmeans import kmeans

__all__ = ["MIN_IMAGES", "PCA_DIMS", "SAMPLE", "Clustering", "nearest", "prepare_features", "spectral_clusters"]

MIN_IMAGES = 12
"""A class with fewer images gets one strategy (a graph on fewer says nothing)."""
PCA_DIMS = 32
_DENSE = 1500  # up to this many images the eigenproblem is solved densely (exact, deterministic)
SAMPLE = 4000
"""Above this many images in a class, the graph is built on a seeded sample of this size and every other
image takes the strategy of most of its 5 nearest sampled images (a Nystrom-style extension)."""


@dataclass(frozen=True)
class Clustering:
    """One class's clusters.

    Attributes:
        labels: int [N], cluster of each image; cluster 0 is the largest, then by size.
        count: the number of clusters.
        eigenvalues: the smallest eigenvalues of the normalised Laplacian, ascending (empty when not computed).
        embedding: float [N, 2], the spectral embedding's first two non-trivial coordinates (for the picture).
        features: float [N, d], the scaled and reduced features the graph was built on.
        reason: why there is one cluster without a graph ("" when the graph decided).

    Above :data:`SAMPLE` images the graph, its eigenvalues and k-means come from a seeded sample;
    the other images follow their nearest sampled neighbours.
    """

    labels: np.ndarray
    count: int
    eigenvalues: np.ndarray
    embedding: np.ndarray
    features: np.ndarray
    reason: str = ""


def _tensor(features: np.ndarray | Tensor, device: torch.device | str | None) -> Tensor:
    x = torch.as_tensor(np.asarray(features, dtype=np.float32) if not isinstance(features, Tensor) else features)
    return x.to(device or "cpu", torch.float32).reshape(len(x), -1)


def _unit_rows(x: Tensor) -> Tensor:
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return torch.where(norm > 0, x / norm.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(x))


def _pca(x: Tensor, dims: int, seed: int, iters: int = 4, oversample: int = 10) -> Tensor:
    """The centred rows' coordinates on their top ``dims`` principal axes (randomized range finder, seeded)."""
    centred = x - x.mean(dim=0)
    width = min(dims + oversample, *x.shape)
    gen = torch.Generator().manual_seed(int(seed))
    q = torch.linalg.qr(centred @ torch.randn(x.shape[1], width, generator=gen).to(x)).Q
    for _ in range(iters):  # power iterations, each re-orthonormalised
        q = torch.linalg.qr(centred.T @ q).Q
        q = torch.linalg.qr(centred @ q).Q
    _, _, vh = torch.linalg.svd(q.T @ centred, full_matrices=False)
    return centred @ vh[:dims].T


def _prepare(x: Tensor, seed: int, dims: int = PCA_DIMS) -> Tensor:
    x = _unit_rows(x)
    if x.shape[1] > dims and x.shape[0] > dims:
        x = _pca(x, dims, seed)
    return x


def prepare_features(
    features: np.ndarray, seed: int = 0, dims: int = PCA_DIMS, device: torch.device | str | None = None
) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), then PCA to at most ``dims`` dimensions.

    The PCA is a seeded randomized one (four power iterations): its coordinates are those of the
    top principal axes up to a rotation of those axes, which leaves every distance the clustering
    reads unchanged. ``device``: where to compute (default the CPU); the result is a host array.

    Example:
        >>> import numpy as np
        >>> from camkit.audit.strategies.spectral import prepare_features
        >>> prepare_features(np.array([[3.0, 4.0], [0.0, 0.0]])).astype(float).round(2).tolist()
        [[0.6, 0.8], [0.0, 0.0]]
    """
    out: np.ndarray = _prepare(_tensor(features, device), seed, dims).cpu().numpy()
    return out


def _nearest(query: Tensor, base: Tensor, k: int, *, skip_self: bool = False, block: int = 1024) -> Tensor:
    """Indices [Q, k] of the ``k`` nearest rows of ``base``, nearest first, in blocks of ``block`` query rows.

    ``skip_self``: ``query`` is ``base``, and a row is never its own neighbour.
    """
    squared = (base * base).sum(dim=1)
    found = []
    for start in range(0, len(query), block):
        q = query[start : start + block]
        d = (q * q).sum(dim=1, keepdim=True) - 2 * (q @ base.T) + squared
        if skip_self:
            rows = torch.arange(len(q), device=q.device)
            d[rows, rows + start] = float("inf")
        found.append(d.topk(k, dim=1, largest=False).indices)
    return torch.cat(found) if found else torch.zeros(0, k, dtype=torch.long, device=query.device)


def nearest(query: np.ndarray, base: np.ndarray, k: int, device: torch.device | str | None = None) -> np.ndarray:
    """Indices [Q, k] of each query row's ``k`` nearest rows of ``base`` (Euclidean), nearest first.

    Computed in blocks of query rows (memory: a block's distances to ``base``), on ``device``.

    Example:
        >>> import numpy as np
        >>> from camkit.audit.strategies.spectral import nearest
        >>> nearest(np.array([[0.0], [2.9]]), np.array([[0.0], [1.0], [3.0]]), 2).tolist()
        [[0, 1], [2, 1]]
    """
    found: np.ndarray = _nearest(_tensor(query, device), _tensor(base, device), k).cpu().numpy()
    return found


def _neighbours(n: int) -> int:
    return int(min(n - 1, max(8, min(20, round(1.5 * np.sqrt(n))))))


@contextmanager
def _one_thread(device: torch.device) -> Iterator[None]:
    """Torch's intra-op threads at one on the CPU for the block (restored after); nothing elsewhere."""
    before = torch.get_num_threads()
    if device.type == "cpu" and before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _top_eigen(near: Tensor, n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``m`` largest eigenpairs of D^-1/2 A D^-1/2 for the symmetric kNN graph ``near`` [n, k].

    Returns (eigenvalues descending, eigenvectors [n, m], D^-1/2 [n]) as float64 host arrays.
    """
    device = near.device
    adjacency = torch.zeros(n, n, device=device)
    adjacency.scatter_(1, near, 1.0)
    adjacency = torch.maximum(adjacency, adjacency.T)
    scale = adjacency.sum(dim=1).double().clamp_min(1e-12).rsqrt()
    if device.type == "cpu" and n > _DENSE:
        from scipy import sparse
        from scipy.sparse.linalg import eigsh

        rows, cols = adjacency.nonzero(as_tuple=True)
        walk = sparse.csr_matrix(
            ((scale[rows] * scale[cols]).numpy(), (rows.numpy(), cols.numpy())), shape=(n, n)
        )  # fmt: skip
        v0 = np.random.default_rng(seed).uniform(0.5, 1.0, n)
        values, vectors = eigsh(walk, k=m, which="LA", v0=v0, tol=1e-6)
        order = np.argsort(values)[::-1]
        return values[order], vectors[:, order], scale.numpy()
    walk = scale[:, None] * adjacency.double() * scale[None, :]
    del adjacency
    values_t, vectors_t = torch.linalg.eigh(walk)
    values_t, vectors_t = values_t.flip(0)[:m], vectors_t.flip(1)[:, :m]
    return values_t.cpu().numpy(), vectors_t.cpu().numpy(), scale.cpu().numpy()


def spectral_clusters(
    features: np.ndarray,
    *,
    max_clusters: int = 6,
    neighbors: int | None = None,
    min_images: int = MIN_IMAGES,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> Clustering:
    """Cluster ``features`` [N, D] spectrally; the number of clusters from the eigengap (1 to ``max_clusters``).

    ``device``: where a class of more than ``_DENSE`` (1,500) images is clustered (its features,
    graph and eigenproblem; default the CPU). Smaller classes are clustered on the CPU whatever
    the device: there the work is milliseconds, less than a GPU's first call of its solver
    library costs. k-means on the embedding's few columns runs on the CPU. The result holds host
    arrays.

    Example:
        >>> import numpy as np
        >>> from camkit.audit.strategies.spectral import spectral_clusters
        >>> rng = np.random.default_rng(0)
        >>> a = rng.normal([5, 0, 0], 0.1, (20, 3)); b = rng.normal([0, 5, 0], 0.1, (10, 3))
        >>> c = spectral_clusters(np.concatenate([a, b]))
        >>> c.count, np.bincount(c.labels).tolist(), c.labels[20:].tolist() == [1] * 10
        (2, [20, 10], True)
        >>> spectral_clusters(a[:5]).reason
        '5 images: strategies need at least 12'
    """
    if max_clusters < 1:
        raise InvalidInputError(f"max_clusters must be at least 1, got {max_clusters}")
    x = _tensor(features, device if len(features) > _DENSE else "cpu")
    with _one_thread(x.device):
        return _cluster(_prepare(x, seed) if len(x) else torch.zeros(0, 1), max_clusters, neighbors, min_images, seed)


def _cluster(x: Tensor, max_clusters: int, neighbors: int | None, min_images: int, seed: int) -> Clustering:
    """:func:`spectral_clusters` on features already prepared (:func:`_prepare`), on their device."""
    n = len(x)
    if n > SAMPLE:
        return _extend(x, max_clusters, neighbors, seed)
    host = x.cpu().numpy()
    if n < max(min_images, 3):
        return Clustering(np.zeros(n, np.int64), 1, np.zeros(0), np.zeros((n, 2)), host,
                          f"{n} image{'s' if n != 1 else ''}: strategies need at least {max(min_images, 3)}")  # fmt: skip
    k = _neighbours(n) if neighbors is None else int(min(n - 1, max(1, neighbors)))
    m = min(max_clusters + 1, n - 1)
    values, vectors, scale = _top_eigen(_nearest(x, x, k, skip_self=True), n, m, seed)
    lap = np.clip(1.0 - values, 0.0, 2.0)  # ascending Laplacian eigenvalues
    gaps = np.diff(lap)[:max_clusters]  # gaps[i] = lam_{i+1} - lam_i: i + 1 clusters
    # the first gap at least half the largest: a random kNN graph inside one group has a large first
    # non-zero eigenvalue itself, so later gaps of similar size say less than the first clear one
    count = int(np.argmax(gaps >= 0.5 * gaps.max())) + 1 if len(gaps) and gaps.max() > 0 else 1
    # a sign convention per eigenvector, so the picture and k-means see the same numbers on every platform
    signs = np.sign(vectors[np.argmax(np.abs(vectors), axis=0), np.arange(vectors.shape[1])])
    vectors = vectors * np.where(signs == 0, 1.0, signs)
    coords = vectors * scale[:, None]  # the random-walk embedding
    embedding = coords[:, 1:3] if coords.shape[1] >= 3 else np.pad(coords[:, 1:], ((0, 0), (0, 3 - coords.shape[1])))
    if count == 1:
        return Clustering(np.zeros(n, np.int64), 1, lap, embedding, host)
    rows = vectors[:, :count]
    rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    raw = kmeans(torch.from_numpy(rows), count, n_init=3, seed=seed).numpy()
    sizes = np.bincount(raw, minlength=count)
    present = [c for c in range(count) if sizes[c]]
    first = {c: int(np.argmax(raw == c)) for c in present}
    ranked = sorted(present, key=lambda c: (-sizes[c], first[c]))
    relabel = np.zeros(count, np.int64)
    relabel[ranked] = np.arange(len(ranked))
    return Clustering(relabel[raw], len(ranked), lap, embedding, host)


def _extend(x: Tensor, max_clusters: int, neighbors: int | None, seed: int) -> Clustering:
    """Cluster a seeded sample of :data:`SAMPLE` rows of ``x``; the others vote with their 5 nearest sampled rows."""
    n = len(x)
    pick = np.sort(np.random.default_rng(seed).choice(n, SAMPLE, replace=False))
    sample = x[torch.from_numpy(pick).to(x.device)]
    core = _cluster(sample, max_clusters, neighbors, 1, seed)
    rest = np.setdiff1d(np.arange(n), pick, assume_unique=True)
    near = _nearest(x[torch.from_numpy(rest).to(x.device)], sample, 5).cpu().numpy()
    votes = core.labels[near]  # [rest, 5]
    counts = np.stack([(votes == c).sum(axis=1) for c in range(core.count)], axis=1)
    labels = np.empty(n, np.int64)
    labels[pick] = core.labels
    labels[rest] = counts.argmax(axis=1)  # ties go to the larger strategy (the smaller id)
    embedding = np.empty((n, core.embedding.shape[1]))
    embedding[pick] = core.embedding
    embedding[rest] = core.embedding[near].mean(axis=1)
    return Clustering(labels, core.count, core.eigenvalues, embedding, x.cpu().numpy())
