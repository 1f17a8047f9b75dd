"""Spectral clustering of one class's images (SpRAy's core): a sparse kNN graph, its embedding, the eigengap.

Features [N, D] (downsampled maps or concept relevance vectors) are scaled to unit length,
reduced to at most :data:`PCA_DIMS` dimensions, joined into a symmetric k-nearest-neighbour
graph (sparse: ``N * k`` edges, so 100,000 images fit), and the graph's normalised
Laplacian gives the spectral embedding. The number of clusters is where the Laplacian's
smallest eigenvalues first jump (the eigengap: the first gap at least half the largest);
k-means on the embedding's rows then assigns the images. Everything is seeded: the same features give the same clusters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InvalidInputError

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


def prepare_features(features: np.ndarray, seed: int = 0, dims: int = PCA_DIMS) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), then PCA to at most ``dims`` dimensions.

    Example:
        >>> import numpy as np
        >>> from camkit.audit.strategies.spectral import prepare_features
        >>> prepare_features(np.array([[3.0, 4.0], [0.0, 0.0]])).astype(float).round(2).tolist()
        [[0.6, 0.8], [0.0, 0.0]]
    """
    x = np.asarray(features, dtype=np.float32).reshape(len(features), -1)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    x = np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)
    if x.shape[1] > dims and x.shape[0] > dims:
        from sklearn.decomposition import PCA

        x = PCA(n_components=dims, random_state=seed, svd_solver="randomized").fit_transform(x).astype(np.float32)
    return x


def nearest(query: np.ndarray, base: np.ndarray, k: int) -> np.ndarray:
    """Indices [Q, k] of each query row's ``k`` nearest rows of ``base`` (Euclidean, scikit-learn), nearest first.

    Example:
        >>> import numpy as np
        >>> from camkit.audit.strategies.spectral import nearest
        >>> nearest(np.array([[0.0], [2.9]]), np.array([[0.0], [1.0], [3.0]]), 2).tolist()
        [[0, 1], [2, 1]]
    """
    from sklearn.neighbors import NearestNeighbors

    found: np.ndarray = NearestNeighbors(n_neighbors=k).fit(base).kneighbors(query, return_distance=False)
    return found


def _neighbours(n: int) -> int:
    return int(min(n - 1, max(8, min(20, round(1.5 * np.sqrt(n))))))


def spectral_clusters(
    features: np.ndarray,
    *,
    max_clusters: int = 6,
    neighbors: int | None = None,
    min_images: int = MIN_IMAGES,
    seed: int = 0,
) -> Clustering:
    """Cluster ``features`` [N, D] spectrally; the number of clusters from the eigengap (1 to ``max_clusters``).

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
    n = len(features)
    x = prepare_features(features, seed) if n else np.zeros((0, 1), np.float32)
    if n > SAMPLE:
        return _extend(x, max_clusters, neighbors, seed)
    if n < max(min_images, 3):
        return Clustering(np.zeros(n, np.int64), 1, np.zeros(0), np.zeros((n, 2)), x,
                          f"{n} image{'s' if n != 1 else ''}: strategies need at least {max(min_images, 3)}")  # fmt: skip
    from scipy import sparse

    k = _neighbours(n) if neighbors is None else int(min(n - 1, max(1, neighbors)))
    near = nearest(x, x, k + 1)[:, 1:]  # each row's k nearest others (itself comes first, at distance 0)
    graph = sparse.csr_matrix((np.ones(n * k), (np.repeat(np.arange(n), k), near.ravel())), shape=(n, n))
    graph.setdiag(0)  # an image with exact duplicates may not come first among its own neighbours
    graph.eliminate_zeros()
    adjacency = graph.maximum(graph.T).tocsr().astype(np.float64)
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    scale = 1.0 / np.sqrt(np.maximum(degree, 1e-12))
    walk = sparse.diags(scale) @ adjacency @ sparse.diags(scale)  # D^-1/2 A D^-1/2: eigenvalues 1 - Laplacian's
    m = min(max_clusters + 1, n - 1)
    if n <= _DENSE:
        values, vectors = np.linalg.eigh(walk.toarray())
        values, vectors = values[::-1][:m], vectors[:, ::-1][:, :m]
    else:
        from scipy.sparse.linalg import eigsh

        v0 = np.random.default_rng(seed).uniform(0.5, 1.0, n)
        values, vectors = eigsh(walk, k=m, which="LA", v0=v0, tol=1e-6)
        order = np.argsort(values)[::-1]
        values, vectors = values[order], vectors[:, order]
    lap = np.clip(1.0 - values, 0.0, 2.0)  # ascending Laplacian eigenvalues
    gaps = np.diff(lap)[: max_clusters]  # gaps[i] = lam_{i+1} - lam_i: i + 1 clusters
    # the first gap at least half the largest: a random kNN graph inside one group has a large first
    # non-zero eigenvalue itself, so later gaps of similar size say less than the first clear one
    count = int(np.argmax(gaps >= 0.5 * gaps.max())) + 1 if len(gaps) and gaps.max() > 0 else 1
    # a sign convention per eigenvector, so the picture and k-means see the same numbers on every platform
    signs = np.sign(vectors[np.argmax(np.abs(vectors), axis=0), np.arange(vectors.shape[1])])
    vectors = vectors * np.where(signs == 0, 1.0, signs)
    coords = vectors * scale[:, None]  # the random-walk embedding
    embedding = coords[:, 1:3] if coords.shape[1] >= 3 else np.pad(coords[:, 1:], ((0, 0), (0, 3 - coords.shape[1])))
    if count == 1:
        return Clustering(np.zeros(n, np.int64), 1, lap, embedding, x)
    from sklearn.cluster import KMeans

    rows = vectors[:, :count]
    rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    raw = KMeans(n_clusters=count, n_init=3, random_state=seed).fit_predict(rows)
    sizes = np.bincount(raw, minlength=count)
    first = np.array([np.argmax(raw == c) for c in range(count)])
    ranked = sorted(range(count), key=lambda c: (-sizes[c], first[c]))
    relabel = np.empty(count, np.int64)
    relabel[ranked] = np.arange(count)
    return Clustering(relabel[raw], count, lap, embedding, x)


def _extend(x: np.ndarray, max_clusters: int, neighbors: int | None, seed: int) -> Clustering:
    """Cluster a seeded sample of :data:`SAMPLE` rows of ``x``; the others vote with their 5 nearest sampled rows."""
    n = len(x)
    pick = np.sort(np.random.default_rng(seed).choice(n, SAMPLE, replace=False))
    core = spectral_clusters(x[pick], max_clusters=max_clusters, neighbors=neighbors, min_images=1, seed=seed)
    rest = np.setdiff1d(np.arange(n), pick, assume_unique=True)
    near = nearest(x[rest], core.features, 5)
    votes = core.labels[near]  # [rest, 5]
    counts = np.stack([(votes == c).sum(axis=1) for c in range(core.count)], axis=1)
    labels = np.empty(n, np.int64)
    labels[pick] = core.labels
    labels[rest] = counts.argmax(axis=1)  # ties go to the larger strategy (the smaller id)
    embedding = np.empty((n, core.embedding.shape[1]))
    embedding[pick] = core.embedding
    embedding[rest] = core.embedding[near].mean(axis=1)
    return Clustering(labels, core.count, core.eigenvalues, embedding, x)
