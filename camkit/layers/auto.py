"""The automatic layer rule: the last layer whose output is a spatial map of the input that feeds the score."""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode, module_tree_version
from ..errors import LayerNotFoundError
from ..functional.tokens import infer_token_grid
from ..hooks import HookScope
from .layout import TokenHint, _signal_layout, conv_ranks, grid_shape, prefix_token_hint, token_prefix
from .names import _names

__all__ = ["all_spatial_here", "auto_layer", "default_score", "is_spatial_here", "qualifying_layers"]


def is_spatial_here(
    model: nn.Module, name: str, module: nn.Module, x: Tensor, forward: Callable[[Tensor], Any] | None
) -> bool:
    """Whether ``module`` (an architecture's default layer) gives a map of more than one position for ``x``.

    One no-grad forward in eval mode: the first image, or the whole batch of a multi-input
    call run through ``forward``. An output that is not a tensor is not judged here (``True``).
    See :func:`all_spatial_here` (this is it for one layer): a decision made before for the same
    model, layer and input shape is reused without a forward.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.layers.auto import is_spatial_here
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1))
        >>> x = torch.rand(1, 3, 8, 8)
        >>> is_spatial_here(net, "0", net[0], x, None), is_spatial_here(net, "1", net[1], x, None)
        (True, False)
    """
    return all_spatial_here(model, [(name, module)], x, forward)


# Decisions of all_spatial_here per model (held weakly): (names, module ids, input shape without the
# batch, dtype, device, module tree version) -> the answer. Only for plain ``model(x)`` calls.
_SPATIAL: weakref.WeakKeyDictionary[nn.Module, dict[tuple[Any, ...], bool]] = weakref.WeakKeyDictionary()


def all_spatial_here(
    model: nn.Module, layers: list[tuple[str, nn.Module]], x: Tensor, forward: Callable[[Tensor], Any] | None
) -> bool:
    """Whether every one of ``layers`` gives a map of more than one position for ``x``: one forward for all.

    Run as :func:`is_spatial_here` says. For a plain call (``forward`` is ``None``) the answer is kept
    per model, layers and input shape (without the batch), dtype and device while no module anywhere
    gains a submodule (:func:`camkit._internal.state.module_tree_version`): a second explainer of the
    same model on inputs of the same shape decides without a forward.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.layers.auto import all_spatial_here
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3), nn.AdaptiveAvgPool2d(1))
        >>> all_spatial_here(net, [("0", net[0]), ("1", net[1])], torch.rand(1, 3, 8, 8), None)
        True
    """
    key = None
    if forward is None:
        key = (tuple(n for n, _ in layers), tuple(id(m) for _, m in layers), tuple(x.shape[1:]), x.dtype, x.device,
               module_tree_version())  # fmt: skip
        known = _SPATIAL.get(model, {}).get(key)
        if known is not None:
            return known
    seen: list[list[object]] = [[] for _ in layers]
    with HookScope() as hooks, torch.no_grad(), eval_mode(model):
        for (_, module), outputs in zip(layers, seen):
            hooks.forward(module, lambda m, i, o, outputs=outputs: outputs.append(o), own_thread=True)
        model(x[:1]) if forward is None else forward(x)
    size = tuple(int(side) for side in x.shape[2:])
    hint, conv = prefix_token_hint(model), len(size) in conv_ranks(model)
    answer = True
    for (_, module), outputs in zip(layers, seen):
        if not outputs or not isinstance(outputs[-1], Tensor):
            continue  # not ours to judge here: the explainer reports what it finds
        grid = grid_shape(module, tuple(outputs[-1].shape), size, hint, conv_model=conv)
        answer = answer and (grid is None or math.prod(grid) > 1)
    if key is not None:
        decisions = _SPATIAL.setdefault(model, {})
        if len(decisions) >= 16:
            decisions.clear()
        decisions[key] = answer
    return answer


_PASS_THROUGH = {"Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "DropPath", "DropBlock2d"}
_ATTENTION_NAMES = {"attn", "attention", "self_attn", "self_attention", "attn_block"}


def _inside_attention(name: str, names: dict[str, nn.Module]) -> bool:
    # The layer or one of its parents is an attention module: q/k/v projections, head norms
    # and position biases live there, and none of them is a map of the image.
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        module = names.get(prefix)
        if parts[end - 1].lower() in _ATTENTION_NAMES or (
            module is not None and "attention" in type(module).__name__.lower()
        ):
            return True
    return False


def default_score(output: Any) -> Tensor:
    """What the automatic layer choice differentiates, per sample.

    The top-1 score of a classifier's ``[B, K]`` logits, the per-sample sum of any other
    tensor output, read from a Hugging Face style output's ``logits`` (or ``out``,
    ``pooler_output``, ``last_hidden_state``) or the first tensor of a tuple or dict.

    Example:
        >>> import torch
        >>> from camkit.layers import default_score
        >>> default_score(torch.tensor([[1.0, 3.0], [5.0, 2.0]])).tolist()
        [3.0, 5.0]
        >>> default_score({"out": torch.ones(2, 3, 4, 4)}).tolist()
        [48.0, 48.0]
    """
    if not isinstance(output, Tensor):
        for key in ("logits", "out", "pooler_output", "last_hidden_state"):
            value = output.get(key) if isinstance(output, dict) else getattr(output, key, None)
            if isinstance(value, Tensor):
                output = value
                break
        else:
            items = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
            tensors = [v for v in items if isinstance(v, Tensor)]
            if not tensors:
                raise LayerNotFoundError(
                    f"the model returns {type(output).__name__}, which the automatic layer choice cannot score; "
                    "pass layer= explicitly (see camkit.list_layers(model, x))."
                )
            output = tensors[0]
    if output.dim() == 2:
        return output.gather(1, output.detach().argmax(dim=1, keepdim=True))[:, 0]
    return output.flatten(1).sum(dim=1) if output.dim() > 1 else output


def _probe(x: Tensor) -> Tensor:
    # Two different images from the first one: the batch check and the input-dependence check
    # need two samples that differ, also when the caller's images are all equal (or zero).
    first = x[:1].detach()
    scale = first.abs().amax().clamp_min(1e-3) * 0.1
    noise = torch.randn(first.shape, generator=torch.Generator().manual_seed(0)).to(first.device, first.dtype)
    return torch.cat([first, first + scale * noise])


class _Candidate(NamedTuple):
    order: int
    name: str
    module: nn.Module
    output: Tensor


def qualifying_layers(
    model: nn.Module,
    x: Tensor,
    *,
    forward: Callable[[Tensor], Any] | None = None,
    score: Callable[[Any], Tensor] | None = None,
) -> list[tuple[str, nn.Module]]:
    """Every layer that is a CAM layer for this input, in the order the forward finishes them.

    A layer qualifies when its output (its last call's) is a spatial map of *this* input:
    ``[B, C, h, w]``, ``[B, h, w, C]`` or ``[B, N, D]`` tokens for an image (``[B, C, t]``,
    ``[B, C, d, h, w]`` and their channel-last forms for a signal, a volume or a video) that
    lie on a grid of more than one position matching the input
    (:func:`camkit.layers.layout.grid_shape`, with the model's own token layout when it says:
    :func:`camkit.layers.layout.prefix_token_hint`), with the batch's
    size, different for different images (so not a parameter or a position table), outside
    any attention module (q/k/v, head norms, position biases), and feeding the score: the
    gradient of the score reaches its grid positions (it does not at a ViT's patch tokens
    after the last attention, since only the class token is read).

    The dry run uses two images made from the first sample (it, and it with some noise), or
    the whole batch when ``forward`` is given (the other inputs of a multi-input model match
    the batch), in eval mode with autograd on; no ``param.grad`` is written.

    Args:
        model: the model.
        x: an input batch [B, C, *S]: [B, C, T], [B, C, H, W] or [B, C, D, H, W].
        forward: how to run the model on a batch (default ``model(batch)``).
        score: per-sample score ``f(output) -> Tensor[B]``; default: the top-1 class score,
            or the sum of any other tensor output.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.layers import qualifying_layers
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        >>> [name for name, _ in qualifying_layers(net, torch.rand(1, 3, 8, 8))]
        ['0', '1']
    """
    probe = x.detach() if forward is not None else _probe(x)
    batch = probe.shape[0]
    distinct = batch > 1 and not torch.equal(probe[0], probe[1])
    size = tuple(int(side) for side in probe.shape[2:])
    hint = prefix_token_hint(model)
    conv = len(size) in conv_ranks(model)  # a convolutional network of this rank: layouts are channel-first
    names = _names(model)
    last: dict[str, _Candidate] = {}
    record = _recorder(last, {3, len(size) + 2})  # tokens, or a map with one axis per spatial axis of the input
    with HookScope() as hooks, torch.enable_grad(), eval_mode(model):
        for name, module in names.items():
            if not _inside_attention(name, names):
                hooks.forward(module, lambda m, a, o, name=name: record(m, a, o, name), own_thread=True)
        leaf = probe.clone().requires_grad_(True)
        output = forward(leaf) if forward is not None else model(leaf)
        total = (score or default_score)(output)
        shaped = _spatial(last, batch, size, hint, conv)
        if not shaped or not total.requires_grad:
            _LAST_DIAGNOSIS.reason = "no_maps" if not shaped else "no_graph"
            return []
        grads = torch.autograd.grad(total.sum(), [c.output for c in shaped], allow_unused=True)
    found = [
        (cand.name, cand.module)
        for cand, grad in zip(shaped, grads)
        if grad is not None
        and not (distinct and torch.equal(cand.output[0], cand.output[1]))  # the same for different images
        and _reaches_grid(cand, grad, size, hint, conv)
    ]
    _LAST_DIAGNOSIS.reason = "" if found else "zero_gradient"
    return found


def _recorder(last: dict[str, _Candidate], ranks: set[int]) -> Callable[[nn.Module, Any, Any, str], Any]:
    """A forward hook keeping, per layer, its last output of one of ``ranks`` dims, in order of finishing."""
    counter = [0]

    def record(module: nn.Module, args: Any, output: Any, name: str) -> Any:
        counter[0] += 1
        if type(module).__name__ in _PASS_THROUGH and any(output is a for a in args):
            return None  # Identity, dropout in eval: the layer before it is the real one (an in-place
            # ReLU also returns its input object, but with new values: it is kept)
        if isinstance(output, Tensor) and output.is_floating_point() and output.dim() in ranks:
            last[name] = _Candidate(counter[0], name, module, output)
            return output.clone()  # later in-place ops change the copy, not the recorded output
        last.pop(name, None)
        return None

    return record


def _spatial(
    last: dict[str, _Candidate], batch: int, size: tuple[int, ...], hint: TokenHint, conv: bool
) -> list[_Candidate]:
    """The recorded outputs that are maps of the batch on a grid of more than one position, in order."""
    return [
        c
        for c in sorted(last.values())
        if c.output.shape[0] == batch
        and c.output.requires_grad
        and (c.output.dim() != 3 or c.output.shape[-1] > 1)  # [B, C, 1] is a pooled vector, not tokens
        and (grid := grid_shape(c.module, tuple(c.output.shape), size, hint, conv_model=conv)) is not None
        and math.prod(grid) > 1
    ]


_LAST_DIAGNOSIS = threading.local()
_REASONS = {
    "no_maps": "no layer's output is a spatial map of this input (channel-first or channel-last maps with "
    "one axis per spatial axis of the input, or [B, N, D] tokens, on a grid of more than one position, "
    "with the batch's size)",
    "no_graph": "the score does not depend on any layer (is the output computed without autograd?)",
    "zero_gradient": "the score's gradient is exactly zero at every spatial layer (an untrained head "
    "initialised to zero, or dead units?), so no layer shows where the score comes from",
}


def _reaches_grid(cand: _Candidate, grad: Tensor, size: tuple[int, ...], hint: TokenHint, conv: bool) -> bool:
    if grad.dim() == 3 and (len(size) != 1 or _signal_layout(cand.module, tuple(grad.shape), size, hint, conv) == "tokens"):
        prefix = token_prefix(grad.shape[1], size, hint)
        if prefix is None:
            prefix = infer_token_grid(grad.shape[1], size)[0]
        grad = grad[:, prefix:]
    return bool(grad.detach().ne(0).any())


def auto_layer(
    model: nn.Module,
    x: Tensor,
    *,
    forward: Callable[[Tensor], Any] | None = None,
    score: Callable[[Any], Tensor] | None = None,
) -> tuple[str, nn.Module]:
    """Pick a CAM layer by a dry run: the last layer that qualifies (see :func:`qualifying_layers`).

    So never a module inside attention, never the stem or patch embedding when later layers
    qualify, never a layer after global pooling (its grid has one position), never a layer
    whose output does not follow the batch or the image. Known architectures have
    per-family defaults that come first (:func:`camkit.layers.defaults.default_layer`).

    Raises:
        LayerNotFoundError: when no layer qualifies; pass ``layer=``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.layers import auto_layer
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> auto_layer(net, torch.zeros(1, 3, 8, 8))[0]
        '1'
    """
    found = qualifying_layers(model, x, forward=forward, score=score)
    if found:
        return found[-1]
    reason = _REASONS.get(getattr(_LAST_DIAGNOSIS, "reason", ""), "no layer qualifies")
    raise LayerNotFoundError(
        f"no CAM layer found automatically in {type(model).__name__} for this {'x'.join(map(str, x.shape[2:]))} "
        f"input: {reason}. Pass layer= explicitly (see camkit.list_layers(model, x))."
    )


