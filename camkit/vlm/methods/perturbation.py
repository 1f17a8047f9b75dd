"""Occlusion and RISE over the image tokens' patches, scored by the tokens' log-probabilities.

A unit is one image token of the language model: the pixels it covers (as the family's
``occlude`` knows them) are set to the **baseline**, by default ``0.0`` in the processor's
normalised pixel space, which is the mean colour of its normalisation (CLIP's, SigLIP's: the grey
of the data set's mean), so an occluded patch carries no more than an average patch's colour.
``baseline=`` takes another value, or a tensor broadcastable to one view's pixels [C, h, w].

* **Occlusion** (Zeiler & Fergus 2014), one unit at a time: the score of unit ``i`` for target ``t``
  is ``log p_t(image) - log p_t(image with unit i occluded)``, the drop its removal causes.
* **RISE** (Petsiuk et al. 2018) on the unit grid: ``masks`` random masks keep each unit with
  probability ``p`` (``keep``, 0.5); the score of unit ``i`` is RISE's estimate
  ``sum_m (s_m - mean(s)) M_mi / (masks * p)``, with ``s_m`` the target's log-probability under mask
  ``m``. Subtracting the mean score shifts every unit by the same amount in expectation (the
  estimate of ``E[s M_i] / p`` minus ``mean(s)``); it removes the noise that the count of each unit's
  draws adds when scores are far from zero, as log-probabilities are. The masks are those of a
  ``torch.Generator`` seeded with ``seed`` (0), drawn per sample, so a sample gets the same masks in
  a batch as alone. The units are the model's own patches, so no smoothing shift is applied.

No gradient is taken. The perturbed inputs of several variants are stacked on the batch axis
(every tensor the processor made lists samples or their images on its first axis), at most
``batch_tokens`` samples per forward (default 8 per sample).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ...errors import InvalidInputError
from ._language import Targets, logits_of, model_inputs
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = ["occlusion", "perturbed_log_probs", "rise", "rise_masks", "rise_scores"]


def _stacked(inputs: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    first = inputs[0]
    return {key: torch.cat([i[key] for i in inputs]) if isinstance(first[key], Tensor) else first[key] for key in first}


def perturbed_log_probs(request: MethodRequest, targets: Targets, keeps: Sequence[Sequence[Tensor]]) -> Tensor:
    """Each target's log-probability under each variant: [V, B, T].

    ``keeps[v][b]`` is a bool [N_b] over sample ``b``'s image tokens (False: occluded) in variant ``v``.
    """
    model, family = request.model, request.family
    baseline = request.options.get("baseline", 0.0)
    batch = len(request.layouts)
    per_forward = max(1, (request.batch_tokens or 8 * batch) // batch)
    out = []
    with torch.no_grad():
        for start in range(0, len(keeps), per_forward):
            group = keeps[start : start + per_forward]
            variants = [family.occlude(model, request.inputs, list(keep), baseline) for keep in group]
            logits = logits_of(model(**model_inputs(request, targets, _stacked(variants))))
            samples = torch.arange(batch, device=logits.device).repeat(len(group))
            out.append(targets.scores(logits, samples).reshape(len(group), batch, -1))
    return torch.cat(out)


def _base(request: MethodRequest, targets: Targets) -> Tensor:
    with torch.no_grad():
        return targets.scores(logits_of(request.model(**model_inputs(request, targets))))


def _split(values: Tensor, counts: Sequence[int]) -> list[Tensor]:
    return [values[b, :n].float() for b, n in enumerate(counts)]


@register_vlm_method("occlusion")
def occlusion(request: MethodRequest) -> UnitScores:
    """The drop of each target's log-probability when one image token's patch is occluded: [T_b, N_b].

    Example:
        >>> from camkit.vlm.methods import get_vlm_method
        >>> get_vlm_method("occlusion") is occlusion
        True
    """
    targets = Targets.of(request)
    sizes = [layout.count for layout in request.layouts]
    base = _base(request, targets)
    keeps = []
    for i in range(max(sizes)):
        keeps.append([torch.arange(n) != i for n in sizes])  # a sample with fewer units keeps them all
    occluded = perturbed_log_probs(request, targets, keeps)  # [N, B, T]
    drops = (base[None] - occluded).permute(1, 2, 0)  # [B, T, N]
    scores = [drops[b, :t, :n].float() for b, (t, n) in enumerate(zip(targets.counts, sizes))]
    return UnitScores(scores, "tokens", _split(base, targets.counts),
                      extras={"baseline": request.options.get("baseline", 0.0)})  # fmt: skip


def rise_masks(count: int, units: int, keep: float, seed: int) -> Tensor:
    """``count`` random masks over ``units`` units, each unit kept with probability ``keep``: bool [count, units].

    Example:
        >>> rise_masks(3, 4, 0.5, 0).shape
        torch.Size([3, 4])
    """
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(count, units, generator=generator) < keep


def rise_scores(scores: Tensor, masks: Tensor, keep: float) -> Tensor:
    """RISE's estimate with the mean score subtracted: ``(scores - mean)^T masks / (M * keep)``.

    ``scores`` [M, T] (each mask's target scores), ``masks`` bool [M, N]; returns [T, N].

    Example:
        >>> import torch
        >>> masks = torch.tensor([[True, False], [False, True]])
        >>> rise_scores(torch.tensor([[-1.0], [-3.0]]), masks, 0.5).tolist()
        [[1.0, -1.0]]
    """
    centred = scores - scores.mean(dim=0, keepdim=True)
    return centred.T.float() @ masks.float() / (masks.shape[0] * keep)


@register_vlm_method("rise")
def rise(request: MethodRequest) -> UnitScores:
    """RISE over the image tokens' patches (see the module docstring): [T_b, N_b].

    Options: ``masks`` (default 256), ``keep`` (0.5), ``seed`` (0), ``baseline`` (0.0).

    Example:
        >>> from camkit.vlm.methods import get_vlm_method
        >>> get_vlm_method("rise") is rise
        True
    """
    options = request.options
    count, keep, seed = int(options.get("masks", 256)), float(options.get("keep", 0.5)), int(options.get("seed", 0))
    if count < 1 or not 0.0 < keep < 1.0:
        raise InvalidInputError(f"RISE needs masks >= 1 and 0 < keep < 1, got masks={count}, keep={keep}")
    targets = Targets.of(request)
    sizes = [layout.count for layout in request.layouts]
    drawn = [rise_masks(count, n, keep, seed) for n in sizes]
    variants = [[masks[m] for masks in drawn] for m in range(count)]
    scores = perturbed_log_probs(request, targets, variants)  # [M, B, T]
    out = [rise_scores(scores[:, b, :t], drawn[b].to(scores.device), keep) for b, t in enumerate(targets.counts)]
    return UnitScores(out, "tokens", _split(_base(request, targets), targets.counts),
                      extras={"baseline": options.get("baseline", 0.0), "masks": count, "keep": keep, "seed": seed})  # fmt: skip
