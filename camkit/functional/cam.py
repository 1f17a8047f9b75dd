"""Pure CAM math on activations ``A`` and gradients ``G`` of shape [B, C, *s].

``*s`` is the layer's grid, with one to three spatial axes (a signal's ``t``, an image's
``h, w``, a volume's or a video's ``d, h, w``); every sum or mean "over space" runs over all
of them. No hooks, no state. Every function returns the *raw* map [B, *s] (after the ReLU
the methods prescribe), in the dtype it was given; explainers pass float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = [
    "gradcam",
    "gradcam_weights",
    "gradcampp_weights",
    "hirescam",
    "layercam",
    "spatial_axes",
    "weighted_maps",
    "weighted_sum",
    "xgradcam_weights",
]


def _check(acts: Tensor, grads: Tensor | None = None) -> None:
    if not 3 <= acts.dim() <= 5:
        raise InvalidInputError(
            f"activations must be [B, C, t], [B, C, h, w] or [B, C, d, h, w], got shape {list(acts.shape)}"
        )
    if grads is not None and grads.shape != acts.shape:
        raise InvalidInputError(
            f"gradients must match activations {list(acts.shape)}, got shape {list(grads.shape)}"
        )


def spatial_axes(t: Tensor) -> tuple[int, ...]:
    """The spatial axes of a [B, C, *s] tensor: ``(2, ..., t.dim() - 1)``.

    Example:
        >>> import torch
        >>> from camkit.functional import spatial_axes
        >>> spatial_axes(torch.zeros(1, 2, 3)), spatial_axes(torch.zeros(1, 2, 3, 4, 5))
        ((2,), (2, 3, 4))
    """
    return tuple(range(2, t.dim()))


def weighted_sum(weights: Tensor, acts: Tensor) -> Tensor:
    """``relu(sum_c weights[b, c] * acts[b, c])``: [B, C] and [B, C, *s] to [B, *s].

    Example:
        >>> import torch
        >>> from camkit.functional import weighted_sum
        >>> weighted_sum(torch.tensor([[1.0, -1.0]]), torch.ones(1, 2, 1, 2) * torch.tensor([3.0, 1.0]).view(1, 2, 1, 1))
        tensor([[[2., 2.]]])
    """
    _check(acts)
    # The product einsum("bc,bc...->b...") computes, without parsing its equation on every call.
    summed = torch.bmm(weights.unsqueeze(1), acts.flatten(2))
    return summed.view(acts.shape[0], *acts.shape[2:]).clamp_min(0)


def gradcam_weights(grads: Tensor) -> Tensor:
    """Grad-CAM (Selvaraju et al. 2017): the spatial mean of the gradient, [B, C].

    Example:
        >>> import torch
        >>> from camkit.functional import gradcam_weights
        >>> gradcam_weights(torch.tensor([[[[1.0, 3.0]]]]))
        tensor([[2.]])
    """
    _check(grads)
    return grads.mean(dim=spatial_axes(grads))


def gradcam(acts: Tensor, grads: Tensor) -> Tensor:
    """Grad-CAM map ``relu(sum_c mean_s(G_c) A_c)``, [B, *s].

    Example:
        >>> import torch
        >>> from camkit.functional import gradcam
        >>> gradcam(torch.tensor([[[[1.0, 2.0]]]]), torch.tensor([[[[1.0, 3.0]]]]))
        tensor([[[2., 4.]]])
    """
    _check(acts, grads)
    return weighted_sum(gradcam_weights(grads), acts)


def gradcampp_weights(acts: Tensor, grads: Tensor) -> Tensor:
    """Grad-CAM++ weights (Chattopadhay et al. 2018, eq. 19 with the exponential score).

    ``alpha = G^2 / (2 G^2 + sum_s(A) G^3)`` and ``w_c = sum_s alpha relu(G)``. Alpha is
    zero only where the denominator is exactly zero; no epsilon is added, so small gradients
    are not swamped by one. The closed form itself is not invariant to the gradients' scale:
    gradients ``k G`` give ``alpha = G^2 / (2 G^2 + k sum_s(A) G^3)``, as in the paper. (With the
    exponential of the score the weights carry a factor ``exp(S)`` per map, which min-max
    normalisation removes; it is left out.)

    Example:
        >>> import torch
        >>> from camkit.functional import gradcampp_weights
        >>> gradcampp_weights(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
        tensor([[0.5000]])
    """
    _check(acts, grads)
    g2 = grads.pow(2)
    denom = 2 * g2 + acts.sum(dim=spatial_axes(acts), keepdim=True) * grads.pow(3)
    alpha = torch.where(denom == 0, 0.0, g2 / denom)  # the division's NaN and inf where denom is 0 are dropped
    return (alpha * grads.clamp_min(0)).sum(dim=spatial_axes(grads))


def xgradcam_weights(acts: Tensor, grads: Tensor) -> Tensor:
    """XGrad-CAM (Fu et al. 2020): ``w_c = sum_s (A_c / sum_s A_c) G_c``, [B, C].

    A channel whose activations sum to exactly zero gets weight zero.

    Example:
        >>> import torch
        >>> from camkit.functional import xgradcam_weights
        >>> xgradcam_weights(torch.tensor([[[[1.0, 3.0]]]]), torch.tensor([[[[2.0, 4.0]]]]))
        tensor([[3.5000]])
    """
    _check(acts, grads)
    total = acts.sum(dim=spatial_axes(acts), keepdim=True)
    safe = torch.where(total == 0, torch.ones_like(total), total)
    share = torch.where(total == 0, torch.zeros_like(acts), acts / safe)
    return (share * grads).sum(dim=spatial_axes(grads))


def hirescam(acts: Tensor, grads: Tensor) -> Tensor:
    """HiResCAM (Draelos & Carin 2020): ``relu(sum_c G_c * A_c)`` elementwise, [B, *s].

    Example:
        >>> import torch
        >>> from camkit.functional import hirescam
        >>> hirescam(torch.tensor([[[[1.0, 2.0]]]]), torch.tensor([[[[-1.0, 3.0]]]]))
        tensor([[[0., 6.]]])
    """
    _check(acts, grads)
    return (grads * acts).sum(dim=1).clamp_min(0)


def layercam(acts: Tensor, grads: Tensor) -> Tensor:
    """LayerCAM (Jiang et al. 2021): ``relu(sum_c relu(G_c) * A_c)``, [B, *s].

    Example:
        >>> import torch
        >>> from camkit.functional import layercam
        >>> layercam(torch.tensor([[[[1.0, 2.0]]]]), torch.tensor([[[[-1.0, 3.0]]]]))
        tensor([[[0., 6.]]])
    """
    _check(acts, grads)
    return (grads.clamp_min(0) * acts).sum(dim=1).clamp_min(0)


def weighted_maps(weights: Tensor, acts: Tensor, *, eigen_smooth: bool = False, exact: bool = True) -> Tensor:
    """K maps per sample from channel weights [B, C, K] and activations [B, C, *s]: [B, K, *s].

    ``relu(sum_c w[b, c, k] A[b, c])``, or with ``eigen_smooth`` the ReLU of the first
    principal component (:func:`camkit.functional.perturbation.eigen_projection`) of the
    weighted activations ``w[b, c, k] A[b, c]`` instead of their channel sum (``exact``: see
    :func:`~camkit.functional.perturbation.eigen_projection`).

    Example:
        >>> import torch
        >>> from camkit.functional import weighted_maps
        >>> acts = torch.tensor([[[[1.0, 2.0]], [[3.0, -4.0]]]])  # [1, 2, 1, 2]
        >>> weighted_maps(torch.tensor([[[1.0], [1.0]]]), acts)
        tensor([[[[4., 0.]]]])
    """
    _check(acts)
    if weights.dim() != 3 or weights.shape[:2] != acts.shape[:2]:
        raise InvalidInputError(
            f"weights must be [B, C, K] with B, C of the activations {list(acts.shape[:2])}, got {list(weights.shape)}"
        )
    if not eigen_smooth:
        return torch.einsum("bck,bc...->bk...", weights, acts).clamp_min(0)
    from .perturbation import eigen_projection

    tail = (None,) * (acts.dim() - 2)
    maps = [eigen_projection(weights[(slice(None), slice(None), k, *tail)] * acts, exact=exact) for k in range(weights.shape[2])]
    return torch.stack(maps, dim=1).clamp_min(0)
