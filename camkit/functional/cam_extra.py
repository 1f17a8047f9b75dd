"""Pure math of the further CAMs: element-wise Grad-CAM, FEM, ShapleyCAM, KPCA-CAM, FullGrad,
Finer-CAM scores and Deep Feature Factorization (a batched non-negative factorisation).

No hooks, no state; shapes are stated per function. Explainers pass float32. Activations
and gradients are [B, C, *s] with one to three spatial axes (``t``; ``h, w``; ``d, h, w``):
"over positions" means over all of them, and maps come back [B, *s].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from ..errors import InvalidInputError
from .cam import _check, spatial_axes
from .maps import normalize_maps, upsample_maps

__all__ = [
    "fem_weights",
    "finer_scores",
    "fullgrad_map",
    "gradcam_elementwise",
    "kpca_projection",
    "nmf",
    "shapley_weights",
]

Kernel = Literal["linear", "poly", "rbf", "sigmoid", "cosine"]
KERNELS = ("linear", "poly", "rbf", "sigmoid", "cosine")


def gradcam_elementwise(acts: Tensor, grads: Tensor) -> Tensor:
    """Element-wise Grad-CAM: ``sum_c relu(G_c * A_c)``, [B, *s].

    Example:
        >>> import torch
        >>> from camkit.functional.cam_extra import gradcam_elementwise
        >>> acts = torch.tensor([[[[1.0, 2.0]], [[3.0, -1.0]]]])
        >>> grads = torch.tensor([[[[-1.0, 3.0]], [[1.0, 1.0]]]])
        >>> gradcam_elementwise(acts, grads)  # [relu(-1) + relu(3), relu(6) + relu(-1)]
        tensor([[[3., 6.]]])
    """
    _check(acts, grads)
    return (grads * acts).clamp_min(0).sum(dim=1)


def fem_weights(acts: Tensor, k: float = 2.0) -> Tensor:
    """FEM (Fuad et al. 2020) channel weights, [B, C]: the share of positions above ``mean + k * std``.

    Mean and (population) standard deviation are taken over each channel's positions (every
    spatial axis of [B, C, *s]); the comparison is strict.

    Example:
        >>> import torch
        >>> from camkit.functional.cam_extra import fem_weights
        >>> fem_weights(torch.tensor([[[[0.0, 0.0, 0.0, 4.0]]]]), k=1.0)  # mean 1, std sqrt(3)
        tensor([[0.2500]])
    """
    _check(acts)
    axes = spatial_axes(acts)
    mean = acts.mean(dim=axes, keepdim=True)
    std = acts.std(dim=axes, keepdim=True, correction=0)
    return (acts > mean + k * std).to(acts.dtype).mean(dim=axes)


def shapley_weights(grads: Tensor, hvp: Tensor) -> Tensor:
    """ShapleyCAM (Cai et al. 2025) channel weights ``mean_s(G - hvp / 2)``, [B, C].

    ``hvp`` is the Hessian of the score with respect to the activations applied to the
    activations, ``H A`` [B, C, *s] (the mean runs over every spatial axis); it is zero where the network after the layer is
    piecewise linear (ReLU heads), and the weights are then Grad-CAM's.

    Example:
        >>> import torch
        >>> from camkit.functional.cam_extra import shapley_weights
        >>> shapley_weights(torch.tensor([[[[2.0, 4.0]]]]), torch.tensor([[[[2.0, 0.0]]]]))
        tensor([[2.5000]])
    """
    _check(grads, hvp)
    return (grads - 0.5 * hvp).mean(dim=spatial_axes(grads))


def _wide(x: Tensor) -> torch.dtype:
    """float64 for the eigen and factorisation solvers, float32 where the device has no float64 (MPS)."""
    return torch.float32 if x.device.type == "mps" else torch.float64


def _kernel_matrix(points: Tensor, kernel: Kernel, gamma: float | None, degree: int, coef0: float) -> Tensor:
    """Kernel matrices [B, N, N] of points [B, N, D]."""
    g = 1.0 / points.shape[2] if gamma is None else gamma
    dots = points @ points.transpose(1, 2)
    if kernel == "linear":
        return dots
    if kernel == "poly":
        return (g * dots + coef0) ** degree
    if kernel == "sigmoid":
        return torch.tanh(g * dots + coef0)
    if kernel == "rbf":
        sq = dots.diagonal(dim1=1, dim2=2)
        return torch.exp(-g * (sq[:, :, None] + sq[:, None, :] - 2 * dots).clamp_min(0))
    norms = points.norm(dim=2)
    safe = torch.where(norms == 0, torch.ones_like(norms), norms)
    return dots / (safe[:, :, None] * safe[:, None, :])


def kpca_projection(
    acts: Tensor, kernel: Kernel = "sigmoid", gamma: float | None = None, degree: int = 3, coef0: float = 1.0
) -> Tensor:
    """KPCA-CAM (Karmani et al. 2024): the first kernel principal component of the positions, [B, *s].

    Each sample's activations [C, *s] are read as ``N = prod(s)`` points in ``C`` dimensions
    (``N = h * w`` for an image, ``t`` for a signal, ``d * h * w`` for a volume), centred
    over the positions; ``K`` is their kernel matrix (``gamma=None`` means ``1 / C``),
    double-centred; the map is the top eigenvector ``v`` of ``K`` scaled by ``sqrt(lambda)``
    (the points' coordinates on the first component; zero when ``lambda <= 0``). The sign is
    fixed so that the map correlates positively with the channel-summed activations (an
    eigenvector's sign is arbitrary; scikit-learn makes its largest entry positive instead).

    Kernels: ``"linear"`` ``<a, b>``, ``"poly"`` ``(gamma <a, b> + coef0) ** degree``,
    ``"rbf"`` ``exp(-gamma |a - b|^2)``, ``"sigmoid"`` ``tanh(gamma <a, b> + coef0)``,
    ``"cosine"`` ``<a, b> / (|a| |b|)``. With ``"linear"`` the map equals Eigen-CAM's.

    Example:
        >>> import torch
        >>> from camkit.functional.cam_extra import kpca_projection
        >>> a = torch.tensor([[[[0.0, 1.0, 2.0]], [[0.0, 2.0, 4.0]]]])
        >>> torch.round(kpca_projection(a, "linear") * 1e4) / 1e4  # = Eigen-CAM's projection
        tensor([[[-2.2361,  0.0000,  2.2361]]])
    """
    _check(acts)
    if kernel not in KERNELS:
        raise InvalidInputError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
    b, c, *grid = acts.shape
    points = acts.reshape(b, c, -1).transpose(1, 2).to(_wide(acts))
    centred = points - points.mean(dim=1, keepdim=True)
    k = _kernel_matrix(centred, kernel, gamma, degree, coef0)
    k = k - k.mean(dim=1, keepdim=True) - k.mean(dim=2, keepdim=True) + k.mean(dim=(1, 2), keepdim=True)
    values, vectors = torch.linalg.eigh((k + k.transpose(1, 2)) / 2)
    top, vector = values[:, -1].clamp_min(0), vectors[:, :, -1]
    projection = vector * top.sqrt()[:, None]
    total = points.sum(dim=2)
    agreement = (projection * (total - total.mean(dim=1, keepdim=True))).sum(dim=1)
    sign = torch.where(agreement < 0, -torch.ones_like(agreement), torch.ones_like(agreement))
    return (projection * sign[:, None]).reshape(b, *grid).to(acts.dtype)


def _channel_sum(term: Tensor, size: tuple[int, ...]) -> Tensor:
    """``sum_c upsample(minmax(|term_c|))``: [B, C, *s] to [B, *size]."""
    normed, _ = normalize_maps(term.abs(), spatial_dims=len(size))
    return upsample_maps(normed, size).sum(dim=1)


def fullgrad_map(input_term: Tensor, bias_terms: Sequence[Tensor]) -> Tensor:
    """FullGrad (Srinivas & Fleuret 2019): ``sum_c psi(x * dS/dx)_c + sum_l sum_c psi(b_l * dS/dz_l)_c``, [B, *S].

    ``psi`` takes the absolute value, min-max normalises each channel of each sample on its
    own (a constant channel gives zeros: no epsilon, so the map does not change with the
    gradients' scale) and upsamples it to the input's size (linear, bilinear or trilinear
    by the number of spatial axes).

    Args:
        input_term: ``x * dS/dx``, [B, C_in, *S]: a signal [B, C, T], an image [B, C, H, W] or
            a volume [B, C, D, H, W].
        bias_terms: per layer ``b * dS/dz`` (the bias broadcast over positions), [B, C_l, *s_l]
            with as many spatial axes as the input, ``z`` the layer's output and ``b`` its
            (effective) bias.

    Example:
        >>> import torch
        >>> from camkit.functional.cam_extra import fullgrad_map
        >>> inp = torch.tensor([[[[0.0, -2.0]]]])          # |.| = [0, 2] -> [0, 1]
        >>> bias = torch.tensor([[[[3.0, 1.0]], [[5.0, 5.0]]]])  # [1, 0] and a flat channel (zeros)
        >>> fullgrad_map(inp, [bias])
        tensor([[[1., 1.]]])
    """
    _check(input_term)
    size = tuple(int(side) for side in input_term.shape[2:])
    total = _channel_sum(input_term, size)
    for term in bias_terms:
        _check(term)
        if term.dim() != input_term.dim():
            raise InvalidInputError(
                f"bias terms must have the input term's {len(size)} spatial axes ([B, C, *s]), got shape "
                f"{list(term.shape)} for an input term of shape {list(input_term.shape)}"
            )
        total = total + _channel_sum(term, size)
    return total


def finer_scores(output: Tensor, main: Tensor, comparisons: int = 3, alpha: float = 1.0) -> Tensor:
    """Finer-CAM (Zhang et al. 2025) targets: the main class's logit against its nearest rivals.

    For sample ``b`` with main class ``m``, the rivals ``R`` are the ``comparisons`` classes
    whose logits are nearest to ``y_m`` (``m`` excluded), and the score is
    ``sum_{j in R} p_j (y_m - alpha y_j) / sum_{j in R} p_j`` with ``p`` the softmax of the
    output. The softmax's normaliser cancels, so it is computed as a softmax over the rivals'
    logits only: exact, without an epsilon, and finite where the probabilities underflow.

    Args:
        output: logits [B, N].
        main: main classes [B] or [B, K] (LongTensor).
        comparisons: rivals per sample (at most ``N - 1``).
        alpha: the weight of the rivals' logits (``0``: plain logit of the main class).

    Returns:
        Scores [B] or [B, K], differentiable with respect to ``output``.

    Example:
        >>> import torch
        >>> from camkit.functional.cam_extra import finer_scores
        >>> y = torch.tensor([[3.0, 1.0, 2.9, -5.0]])
        >>> finer_scores(y, torch.tensor([0]), comparisons=1)  # 3.0 - 2.9
        tensor([0.1000])
    """
    if output.dim() != 2:
        raise InvalidInputError(f"Finer-CAM needs class logits [B, N], got shape {list(output.shape)}")
    n = output.shape[1]
    if not 1 <= comparisons <= n - 1:
        raise InvalidInputError(
            f"comparisons must be between 1 and {n - 1} (the number of other classes), got {comparisons}; "
            "Finer-CAM compares a class with its nearest rivals, so the model needs at least 2 classes."
        )
    multi = main.dim() == 2
    idx = main if multi else main[:, None]  # [B, K]
    y_main = output.gather(1, idx)  # [B, K]
    with torch.no_grad():
        distance = (output[:, None, :] - y_main[:, :, None]).abs()  # [B, K, N]
        distance.scatter_(2, idx[:, :, None], float("inf"))
        rivals = distance.topk(comparisons, dim=2, largest=False).indices  # [B, K, R]
    y_rivals = output[:, None, :].expand(-1, idx.shape[1], -1).gather(2, rivals)
    weights = y_rivals.softmax(dim=2)
    scores = (weights * (y_main[:, :, None] - alpha * y_rivals)).sum(dim=2)
    return scores if multi else scores[:, 0]


def _nndsvda(x: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Boutsidis & Gallopoulos's NNDSVD start [B, C, r], [B, r, N]; zeros filled with the mean."""
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    w = torch.zeros(x.shape[0], x.shape[1], rank, dtype=x.dtype, device=x.device)
    h = torch.zeros(x.shape[0], rank, x.shape[2], dtype=x.dtype, device=x.device)
    w[:, :, 0] = s[:, 0, None].sqrt() * u[:, :, 0].abs()
    h[:, 0, :] = s[:, 0, None].sqrt() * vh[:, 0, :].abs()
    for j in range(1, min(rank, s.shape[1])):
        a, bvec = u[:, :, j], vh[:, j, :]
        ap, an, bp, bn = a.clamp_min(0), (-a).clamp_min(0), bvec.clamp_min(0), (-bvec).clamp_min(0)
        ap_n, an_n, bp_n, bn_n = ap.norm(dim=1), an.norm(dim=1), bp.norm(dim=1), bn.norm(dim=1)
        pos, neg = ap_n * bp_n, an_n * bn_n
        use_pos = (pos >= neg)[:, None]
        scale = torch.where(use_pos[:, 0], pos, neg)
        a_sel = torch.where(use_pos, ap / ap_n.clamp_min(1e-30)[:, None], an / an_n.clamp_min(1e-30)[:, None])
        b_sel = torch.where(use_pos, bp / bp_n.clamp_min(1e-30)[:, None], bn / bn_n.clamp_min(1e-30)[:, None])
        factor = (s[:, j] * scale).sqrt()[:, None]
        w[:, :, j] = factor * a_sel
        h[:, j, :] = factor * b_sel
    mean = x.mean(dim=(1, 2), keepdim=True)
    return torch.where(w == 0, mean, w), torch.where(h == 0, mean, h)


def nmf(x: Tensor, rank: int, iterations: int = 200, tol: float = 1e-4) -> tuple[Tensor, Tensor]:
    """Batched non-negative matrix factorisation ``x ≈ W @ H`` (Frobenius loss).

    Deterministic: an NNDSVDa start (from a batched SVD, no random numbers), then at most
    ``iterations`` rounds of hierarchical alternating least squares (HALS: each row of ``H``,
    then each column of ``W``, solved exactly in turn and clipped at zero). Every 10 rounds
    each sample's error ``|x - W H|`` is checked; a sample whose error fell by less than
    ``tol`` times its initial error since the last check stops there. Samples are
    factorised and stopped each on its own, so a batch gives what its samples give one by one.

    Args:
        x: non-negative [B, C, N].
        rank: number of components ``r``.
        iterations: the most HALS rounds.
        tol: the stopping threshold (``0``: always run ``iterations`` rounds).

    Returns:
        ``(W, H)``: [B, C, r] and [B, r, N], both non-negative, computed in float64 (float32 on
        MPS) and returned in ``x``'s dtype.

    Example:
        >>> import torch
        >>> from camkit.functional.cam_extra import nmf
        >>> g = torch.Generator().manual_seed(0)
        >>> w0, h0 = torch.rand(1, 5, 2, generator=g), torch.rand(1, 2, 9, generator=g)
        >>> w, h = nmf(w0 @ h0, 2, tol=0)
        >>> bool(torch.allclose(w @ h, w0 @ h0, atol=1e-4))
        True
    """
    if x.dim() != 3:
        raise InvalidInputError(f"nmf needs [B, C, N], got shape {list(x.shape)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(x.shape[1], x.shape[2]):
        raise InvalidInputError(
            f"rank must be an int between 1 and min(C, N) = {min(x.shape[1], x.shape[2])}, got {rank!r}"
        )
    if bool((x < 0).any()):
        raise InvalidInputError("nmf needs a non-negative input; subtract each row's minimum first")
    data = x.to(_wide(x))
    w, h = _nndsvda(data, rank)
    tiny = torch.finfo(data.dtype).tiny
    first = previous = torch.linalg.matrix_norm(data - w @ h)  # [B]
    active = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    for step in range(1, iterations + 1):
        keep_w, keep_h = w, h
        w, h = w.clone(), h.clone()
        wt = w.transpose(1, 2)
        wtx, wtw = wt @ data, wt @ w  # [B, r, N], [B, r, r]
        for j in range(rank):
            change = (wtx[:, j : j + 1] - wtw[:, j : j + 1] @ h) / wtw[:, j, j, None, None].clamp_min(tiny)
            h[:, j : j + 1] = (h[:, j : j + 1] + change).clamp_min(0)
        ht = h.transpose(1, 2)
        xht, hht = data @ ht, h @ ht  # [B, C, r], [B, r, r]
        for j in range(rank):
            change = (xht[:, :, j : j + 1] - w @ hht[:, :, j : j + 1]) / hht[:, j, j, None, None].clamp_min(tiny)
            w[:, :, j : j + 1] = (w[:, :, j : j + 1] + change).clamp_min(0)
        frozen = ~active[:, None, None]
        w, h = torch.where(frozen, keep_w, w), torch.where(frozen, keep_h, h)
        if tol > 0 and step % 10 == 0:
            error = torch.linalg.matrix_norm(data - w @ h)
            active = active & ((previous - error) >= tol * first)
            previous = error
            if not bool(active.any()):
                break
    return w.to(x.dtype), h.to(x.dtype)
