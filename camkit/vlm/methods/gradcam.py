"""Grad-CAM for a vision-language model's tokens, on the vision features its language model receives.

For target ``t`` (a token's log-probability, or a phrase's) of a sample, with ``A`` the feature
layer's output flattened to rows [rows, D] and ``G_t`` the gradient of the target at ``A``:

* channel weights per image ``k`` of the sample: ``w_k = mean over the image's rows r of G_t[r]`` [D]
  (the rows that reach the language model, every view of the image together);
* the score of row ``r`` of image ``k``: ``relu(sum_d w_k[d] * A[r, d])``.

The rows' scores are painted into their boxes on the original image by the caller. The default
layer is the family's feature layer (LLaVA's ``vision_feature_layer`` hidden state); ``layer=``
takes another module whose output has the same rows (an earlier vision encoder layer, say).

One forward serves every target of the batch. Its graph starts at the feature layer (the vision
tower before it runs without autograd) and no parameter requires a gradient. The gradients of all
targets are taken in one batched backward (``torch.autograd.grad(..., is_grads_batched=True)``,
at most ``batch_tokens`` targets at a time), or, where an operation of the model has no batching
rule, one backward per target on the retained graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...errors import InvalidInputError
from ...hooks import LayerCapture
from ...targets.tokens import token_log_probs
from ..families.base import ImageTokens, module_name
from .registry import MethodRequest, UnitScores, register_vlm_method

__all__ = ["gradcam", "row_gradcam", "target_gradients"]


def row_gradcam(activation: Tensor, gradients: Tensor, image: Tensor) -> Tensor:
    """Grad-CAM scores [T, R] of R rows from their activations [R, D] and T targets' gradients [T, R, D].

    ``image`` [R] says which image each row belongs to: each image has its own channel weights,
    the mean gradient over its rows.

    Example:
        >>> import torch
        >>> from camkit.vlm.methods.gradcam import row_gradcam
        >>> a = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
        >>> g = torch.tensor([[[1.0, 3.0], [3.0, -1.0], [0.0, 5.0]]])
        >>> row_gradcam(a, g, torch.tensor([0, 0, 1]))  # image 0: w = (2, 1); image 1: w = (0, 5)
        tensor([[2., 2., 5.]])
    """
    count = int(image.max()) + 1 if image.numel() else 0
    sums = gradients.new_zeros(gradients.shape[0], count, gradients.shape[2])
    sums.index_add_(1, image, gradients)
    rows = torch.bincount(image, minlength=count).clamp(min=1).to(gradients.dtype)
    weights = sums / rows[None, :, None]  # [T, images, D]
    return torch.relu((weights[:, image] * activation[None]).sum(dim=-1))


def _batched(scores: Tensor, activation: Tensor, chunk: int) -> Tensor:
    grads = []
    for start in range(0, scores.shape[0], chunk):
        part = scores[start : start + chunk]
        eye = torch.zeros(part.shape[0], scores.shape[0], device=scores.device, dtype=scores.dtype)
        eye[:, start : start + part.shape[0]] = torch.eye(part.shape[0], device=scores.device, dtype=scores.dtype)
        (grad,) = torch.autograd.grad(scores, activation, eye, retain_graph=True, is_grads_batched=True)
        grads.append(grad)
    return torch.cat(grads)


def _looped(scores: Tensor, activation: Tensor) -> Tensor:
    grads = [torch.autograd.grad(score, activation, retain_graph=True)[0] for score in scores]
    return torch.stack(grads)


def target_gradients(scores: Tensor, activation: Tensor, batch_tokens: int | None, *, batched: bool = True) -> Tensor:
    """The gradient of each score [n] at ``activation``: [n, *activation.shape].

    Batched backwards of at most ``batch_tokens`` scores each (``None``: all at once), or one
    backward per score where batching is off or the model has an operation vmap cannot batch.
    """
    if batch_tokens is not None and (isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 1):
        raise InvalidInputError(f"batch_tokens must be a positive int or None, got {batch_tokens!r}")
    if scores.shape[0] == 0:
        return activation.new_zeros(0, *activation.shape)
    if batched and scores.shape[0] > 1 and batch_tokens != 1:
        try:
            return _batched(scores, activation, batch_tokens or scores.shape[0])
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:
            pass  # an operation without a batching rule for its backward: one backward per target
    return _looped(scores, activation)


def _flat_targets(request: MethodRequest, device: torch.device) -> tuple[Tensor, Tensor, list[int]]:
    """Positions and tokens [B, T_max, K] (padded with the first target) and each sample's target count."""
    counts = [int(p.shape[0]) for p in request.positions]
    width = max(int(p.shape[1]) for p in request.positions)
    most = max(counts)
    positions = torch.ones(len(counts), most, width, dtype=torch.long)
    tokens = torch.zeros(len(counts), most, width, dtype=torch.long)
    for b, (pos, ids) in enumerate(zip(request.positions, request.token_ids)):
        if pos.shape[1] != width:
            raise InvalidInputError("every sample's targets must span the same number of tokens")
        positions[b, : counts[b]], tokens[b, : counts[b]] = pos, ids
        positions[b, counts[b] :] = pos[0] if counts[b] else 1
        tokens[b, counts[b] :] = ids[0] if counts[b] else 0
    return positions.to(device), tokens.to(device), counts


@register_vlm_method("gradcam")
def gradcam(request: MethodRequest) -> UnitScores:
    """Grad-CAM scores over each sample's feature rows (see the module docstring).

    Options: ``batched`` (default True): batched backwards where the model allows them.
    """
    model, layouts = request.model, request.layouts
    layer = request.layer if request.layer is not None else request.family.feature_layer(model)
    name = module_name(model, layer)
    batched = bool(request.options.get("batched", True))
    unknown = set(request.options) - {"batched"}
    if unknown:
        raise InvalidInputError(f"gradcam takes the option 'batched' only, got {sorted(unknown)}")
    ids = request.inputs["input_ids"]
    positions, tokens, counts = _flat_targets(request, ids.device)
    with LayerCapture([(name, layer)]) as capture:
        logits = model(**request.inputs, use_cache=False).logits
        log_probs = token_log_probs(logits, positions.flatten(1), tokens.flatten(1)).view(positions.shape).sum(-1)
        wanted = torch.cat([log_probs[b, :n] for b, n in enumerate(counts)])
        (activation,) = capture.activations()
        grads = target_gradients(wanted, activation, request.batch_tokens, batched=batched)
    flat_act = activation.detach().reshape(-1, activation.shape[-1]).float()
    flat_grads = grads.reshape(grads.shape[0], -1, activation.shape[-1])
    scores, start = [], 0
    for b, layout in enumerate(layouts):
        scores.append(_sample_scores(flat_act, flat_grads[start : start + counts[b]], layout))
        start += counts[b]
    return UnitScores(
        scores=scores, units="rows", log_probs=[log_probs[b, :n].detach().float() for b, n in enumerate(counts)],
        layers=(name,),
    )


def _sample_scores(activation: Tensor, gradients: Tensor, layout: ImageTokens) -> Tensor:
    rows = layout.feature_rows.to(activation.device)
    if rows.numel() and int(rows.max()) >= activation.shape[0]:
        raise InvalidInputError(
            f"the layer's output has {activation.shape[0]} rows but the layout reads row {int(rows.max())}: "
            "choose a layer whose output has the feature layer's rows (a vision encoder layer)"
        )
    image = layout.feature_image.to(activation.device)
    return row_gradcam(activation[rows], gradients[:, rows].float(), image)
