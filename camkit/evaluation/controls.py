"""Maps that need no model (the controls) and the sanity gates that mark a method as failing.

Controls are ranked beside the methods, so every score is seen next to what a map that knows
nothing of the model gets: :func:`edge_map` (the Sobel gradient magnitude of the input),
:func:`centre_map` (a centred Gaussian) and the registry's ``randomcam``. The gates
(:func:`gate_checks`) run on one batch: model randomisation (Adebayo et al. 2018: the maps of
a fully re-initialised copy must differ) and random logit (Sixt et al. 2020: the map of a
random other class must differ from the map of the explained class).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..functional import normalize_maps
from ..metrics import random_logit, randomization_check, spearman

__all__ = ["CONTROLS", "GATE_THRESHOLD", "centre_map", "edge_map", "gate_checks"]

CONTROLS = ("edge", "centre", "randomcam")
"""The control "methods" added to every evaluation, in their order."""

GATE_THRESHOLD = 0.5
"""A method fails a gate when the mean Spearman correlation between its maps and the changed maps is above this."""


def edge_map(x: Tensor) -> Tensor:
    """The Sobel gradient magnitude of the channel mean of ``x`` [B, C, H, W], normalised: [B, H, W].

    Other ranks ([B, C, T], [B, C, D, H, W]) use central differences along every spatial axis.

    Example:
        >>> import torch
        >>> from camkit.evaluation.controls import edge_map
        >>> x = torch.zeros(1, 3, 5, 6); x[..., 3:] = 1.0
        >>> edge_map(x)[0, 2].tolist()
        [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    """
    if x.dim() < 3:
        raise InvalidInputError(f"edge_map expects inputs [B, C, *S], got {list(x.shape)}")
    gray = x.detach().float().mean(dim=1)
    if x.dim() == 4:
        kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=x.device)
        kernels = torch.stack([kx, kx.t()])[:, None]  # [2, 1, 3, 3]
        padded = F.pad(gray[:, None], (1, 1, 1, 1), mode="replicate")
        grads = F.conv2d(padded, kernels)  # [B, 2, H, W]
        magnitude = grads.square().sum(dim=1).sqrt()
    else:
        axes = tuple(range(1, gray.dim()))
        steps = list(torch.gradient(gray, dim=axes)) if all(s > 1 for s in gray.shape[1:]) else [torch.zeros_like(gray)]
        magnitude = torch.stack(steps).square().sum(dim=0).sqrt()
    # one map per input, of any rank: normalised as one flat axis
    return normalize_maps(magnitude.flatten(1), spatial_dims=1)[0].view_as(magnitude)


def centre_map(x: Tensor, sigma: float = 0.25) -> Tensor:
    """A centred Gaussian for each input of [B, C, *S]: [B, *S] in [0, 1], peak 1 at the centre.

    ``sigma`` is a share of each axis's length.

    Example:
        >>> import torch
        >>> from camkit.evaluation.controls import centre_map
        >>> m = centre_map(torch.zeros(2, 3, 5, 5))
        >>> tuple(m.shape), float(m[0, 2, 2]), bool(m[0, 0, 0] < m[0, 1, 1] < 1)
        ((2, 5, 5), 1.0, True)
    """
    spatial = x.shape[2:]
    total = torch.zeros(spatial, device=x.device)
    for axis, size in enumerate(spatial):
        coord = torch.arange(size, device=x.device, dtype=torch.float32) - (size - 1) / 2
        shape = [1] * len(spatial)
        shape[axis] = size
        total = total + (coord / (sigma * size)).square().view(shape) / 2
    return torch.exp(-total).expand(x.shape[0], *spatial).clone()


def gate_checks(
    factory: Callable[[nn.Module], Any], model: nn.Module, x: Tensor, target: Tensor, classes: int, *, seed: int
) -> dict[str, dict[str, Any]]:
    """The sanity gates of one method on one batch.

    Args:
        factory: ``f(model) -> explainer`` (called on copies of the model for randomisation).
        model: the classifier; never modified.
        x: inputs [B, C, H, W]; target: classes [B]; classes: the model's number of outputs.
        seed: seeds the random weights and the random classes.

    Returns:
        ``{"model_randomisation": {...}, "random_logit": {...}}``, each with ``spearman`` (mean
        correlation with the original maps), ``passed`` (below :data:`GATE_THRESHOLD`) and ``note``.
    """
    gates: dict[str, dict[str, Any]] = {}
    try:
        res = randomization_check(factory, model, x, target, layers=[""], seed=seed)
        rho = float(res.spearman[-1].nan_to_num(0.0).mean())
        gates["model_randomisation"] = {"spearman": rho, "passed": rho < GATE_THRESHOLD, "note": ""}
    except Exception as err:  # a gate that cannot run is reported, not fatal
        gates["model_randomisation"] = {"spearman": None, "passed": None, "note": f"{type(err).__name__}: {err}"}
    if classes < 2:
        gates["random_logit"] = {"spearman": None, "passed": None, "note": "the model has one output"}
        return gates
    try:
        generator = torch.Generator().manual_seed(seed + 1)
        similarity = random_logit(factory(model), model, x, target, num_classes=classes, similarity=spearman,
                                  generator=generator)  # fmt: skip
        rho = float(similarity.nan_to_num(0.0).mean())
        gates["random_logit"] = {"spearman": rho, "passed": rho < GATE_THRESHOLD, "note": ""}
    except Exception as err:
        gates["random_logit"] = {"spearman": None, "passed": None, "note": f"{type(err).__name__}: {err}"}
    return gates
