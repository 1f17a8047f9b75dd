"""Find target layers: by dotted name, by module, or automatically."""

from __future__ import annotations

import difflib
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Union

import torch
from torch import Tensor, nn

from ._state import eval_mode
from .architectures import default_layer
from .errors import CamkitWarning, InvalidInputError, LayerNotFoundError
from .hooks import HookScope

__all__ = ["LayerInfo", "LayerSpec", "auto_layer", "list_layers", "qualifying_layers", "resolve_layers"]

LayerSpec = Union[str, nn.Module, Sequence[Union[str, nn.Module]], None]


class LayerInfo(NamedTuple):
    """One module call seen in a forward pass."""

    name: str
    type: str
    output_shape: tuple[int, ...] | None

    def __str__(self) -> str:
        shape = "x".join(map(str, self.output_shape)) if self.output_shape is not None else "-"
        return f"{self.name:<40} {self.type:<24} {shape}"


def _names(model: nn.Module) -> dict[str, nn.Module]:
    return {name: module for name, module in model.named_modules() if name}


_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _strip_wrappers(name: str, names: dict[str, nn.Module]) -> str | None:
    # DataParallel / DistributedDataParallel add "module.", torch.compile adds "_orig_mod.":
    # a name written for the wrapper resolves on the bare model and the other way round.
    if name in names:
        return name
    for prefix in _WRAPPER_PREFIXES:
        if prefix + name in names:
            return prefix + name
        if name.startswith(prefix):
            found = _strip_wrappers(name[len(prefix) :], names)
            if found is not None:
                return found
    return None


def _resolve_one(model: nn.Module, spec: str | nn.Module, names: dict[str, nn.Module]) -> tuple[str, nn.Module]:
    if isinstance(spec, nn.Module):
        for name, module in names.items():
            if module is spec:
                return name, module
        if spec is model:
            raise LayerNotFoundError(
                "the target layer is the whole model; pass one of its submodules "
                "(see camkit.list_layers(model, x))."
            )
        raise LayerNotFoundError(
            f"the module {type(spec).__name__} passed as layer is not part of the model; pass a "
            "submodule of the model you explain, or its dotted name."
        )
    if not isinstance(spec, str):
        raise TypeError(
            f"each layer must be a dotted name (str) or a module of the model, got {type(spec).__name__} {spec!r}"
        )
    found = _strip_wrappers(spec, names)
    if found is None:
        close = difflib.get_close_matches(spec, list(names), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise LayerNotFoundError(
            f"no layer '{spec}' in {type(model).__name__}{hint} See camkit.list_layers(model, x)."
        )
    return found, names[found]


def resolve_layers(
    model: nn.Module,
    layer: LayerSpec,
    example: Tensor | None = None,
    *,
    forward: Callable[[Tensor], Any] | None = None,
    score: Callable[[Any], Tensor] | None = None,
) -> list[tuple[str, nn.Module]]:
    """Turn a layer argument into ``(dotted name, module)`` pairs.

    Names written for a ``DataParallel`` (``module.``) or ``torch.compile`` (``_orig_mod.``)
    wrapper resolve on the bare model and the other way round.

    Args:
        model: the model to explain.
        layer: a dotted name from ``model.named_modules()``, a module, a list of either, or
            ``None``: the architecture's default layer for known torchvision families (see
            :func:`camkit.architectures.default_layer`), else :func:`auto_layer` (which
            needs ``example``).
        example: an input batch, used only when ``layer`` is ``None``.
        forward: how to run the model on ``example`` for the dry run (default ``model(example)``).
        score: what the dry run differentiates (see :func:`qualifying_layers`).

    Example:
        >>> from torch import nn
        >>> from camkit.layers import resolve_layers
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        >>> resolve_layers(net, "0")[0][0]
        '0'
    """
    names = _names(model)
    if layer is None:
        known = default_layer(model)
        found = None if known is None else _strip_wrappers(known, names)
        if found is not None and (example is None or _is_spatial_here(model, found, names[found], example, forward)):
            return [(found, names[found])]
        if example is None:
            raise InvalidInputError("layer=None needs an example input to find a layer automatically")
        chosen = auto_layer(model, example, forward=forward, score=score)
        if found is not None:
            warnings.warn(
                f"{type(model).__name__}'s default layer '{found}' gives no spatial map on this "
                f"{example.shape[-2]}x{example.shape[-1]} input (1x1, say); using '{chosen[0]}', the last layer that "
                "does. Pass layer= to choose.",
                CamkitWarning,
                stacklevel=3,
            )
        return [chosen]
    if isinstance(layer, (str, nn.Module)):
        specs: list[str | nn.Module] = [layer]
    elif isinstance(layer, (list, tuple)):
        specs = list(layer)
    else:
        raise TypeError(
            f"layer must be a dotted name (str), a module of the model, a list of them, or None (automatic), "
            f"got {type(layer).__name__} {layer!r}; see camkit.list_layers(model, x) for the names."
        )
    if not specs:
        raise LayerNotFoundError("layer is an empty list; give at least one layer")
    resolved = [_resolve_one(model, spec, names) for spec in specs]
    seen = set()
    for name, _ in resolved:
        if name in seen:
            raise LayerNotFoundError(f"layer '{name}' is listed twice")
        seen.add(name)
    return resolved


def _is_spatial_here(
    model: nn.Module, name: str, module: nn.Module, x: Tensor, forward: Callable[[Tensor], Any] | None
) -> bool:
    # One no-grad forward (the first image, or the batch of a multi-input call) to check that the
    # architecture's default layer is a map of more than one position for this input size.
    from .architectures import prefix_token_hint
    from .layout import grid_shape

    seen: list[object] = []
    with HookScope() as hooks, torch.no_grad(), eval_mode(model):
        hooks.forward(module, lambda m, i, o: seen.append(o), own_thread=True)
        model(x[:1]) if forward is None else forward(x)
    if not seen or not isinstance(seen[-1], Tensor):
        return True  # not ours to judge here: the explainer reports what it finds
    size = (int(x.shape[-2]), int(x.shape[-1]))
    grid = grid_shape(module, tuple(seen[-1].shape), size, prefix_token_hint(model))
    return grid is None or grid[0] * grid[1] > 1


def _trace(
    model: nn.Module, x: Tensor, forward: Callable[[Tensor], Any] | None = None
) -> list[tuple[str, nn.Module, Tensor | object]]:
    names = _names(model)
    seen: list[tuple[str, nn.Module, Tensor | object]] = []
    with HookScope() as hooks, torch.no_grad(), eval_mode(model):
        for name, module in names.items():
            hooks.forward(module, lambda m, i, o, name=name: seen.append((name, m, o)), own_thread=True)
        if forward is None:
            model(x)
        else:
            forward(x)
    return seen


def _shape(output: object) -> tuple[int, ...] | None:
    return tuple(output.shape) if isinstance(output, Tensor) else None


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
    # What the dry run differentiates: the top-1 score of a classifier, the sum of any other
    # tensor output (per sample), the logits of a Hugging Face style output.
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
    ``[B, C, h, w]``, ``[B, h, w, C]`` or ``[B, N, D]`` tokens that lie on a grid of more than
    one position matching the input (:func:`camkit.layout.grid_shape`), with the batch's
    size, different for different images (so not a parameter or a position table), outside
    any attention module (q/k/v, head norms, position biases), and feeding the score: the
    gradient of the score reaches its grid positions (it does not at a ViT's patch tokens
    after the last attention, since only the class token is read).

    The dry run uses two images made from the first sample (it, and it with some noise), or
    the whole batch when ``forward`` is given (the other inputs of a multi-input model match
    the batch), in eval mode with autograd on; no ``param.grad`` is written.

    Args:
        model: the model.
        x: an input batch [B, C, H, W].
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
    from .architectures import prefix_token_hint
    from .layout import grid_shape

    probe = x.detach() if forward is not None else _probe(x)
    batch = probe.shape[0]
    distinct = batch > 1 and not torch.equal(probe[0], probe[1])
    size = (int(probe.shape[-2]), int(probe.shape[-1]))
    hint = prefix_token_hint(model)
    names = _names(model)
    last: dict[str, _Candidate] = {}
    counter = [0]

    def record(module: nn.Module, args: Any, output: Any, name: str) -> Any:
        counter[0] += 1
        if type(module).__name__ in _PASS_THROUGH and any(output is a for a in args):
            return None  # Identity, dropout in eval: the layer before it is the real one (an in-place
            # ReLU also returns its input object, but with new values: it is kept)
        if isinstance(output, Tensor) and output.is_floating_point() and output.dim() in (3, 4):
            last[name] = _Candidate(counter[0], name, module, output)
            return output.clone()  # later in-place ops change the copy, not the recorded output
        last.pop(name, None)
        return None

    with HookScope() as hooks, torch.enable_grad(), eval_mode(model):
        for name, module in names.items():
            if not _inside_attention(name, names):
                hooks.forward(module, lambda m, a, o, name=name: record(m, a, o, name), own_thread=True)
        leaf = probe.clone().requires_grad_(True)
        output = forward(leaf) if forward is not None else model(leaf)
        total = (score or default_score)(output)
        shaped = [
            c
            for c in sorted(last.values())
            if c.output.shape[0] == batch
            and c.output.requires_grad
            and (c.output.dim() == 4 or c.output.shape[-1] > 1)  # [B, C, 1] is a pooled vector, not tokens
            and (grid := grid_shape(c.module, tuple(c.output.shape), size, hint)) is not None
            and grid[0] * grid[1] > 1
        ]
        if not shaped or not total.requires_grad:
            _LAST_DIAGNOSIS.reason = "no_maps" if not shaped else "no_graph"
            return []
        grads = torch.autograd.grad(total.sum(), [c.output for c in shaped], allow_unused=True)
    found = []
    reached = False
    for cand, grad in zip(shaped, grads):
        if grad is None:
            continue
        if distinct and torch.equal(cand.output[0], cand.output[1]):
            continue  # the same for different images: not a map of the input
        if not _reaches_grid(cand, grad, size, hint):
            continue
        reached = True
        found.append((cand.name, cand.module))
    _LAST_DIAGNOSIS.reason = "" if reached else "zero_gradient"
    return found


_LAST_DIAGNOSIS = threading.local()
_REASONS = {
    "no_maps": "no layer's output is a spatial map of this input ([B, C, h, w], [B, h, w, C] or [B, N, D] "
    "tokens on a grid of more than one position, with the batch's size)",
    "no_graph": "the score does not depend on any layer (is the output computed without autograd?)",
    "zero_gradient": "the score's gradient is exactly zero at every spatial layer (an untrained head "
    "initialised to zero, or dead units?), so no layer shows where the score comes from",
}


def _reaches_grid(cand: _Candidate, grad: Tensor, size: tuple[int, int], hint: int | None) -> bool:
    from .layout import token_prefix

    if grad.dim() == 3:
        prefix = token_prefix(grad.shape[1], size, hint)
        if prefix is None:
            from .functional.tokens import infer_token_grid

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
    per-family defaults that come first (:func:`camkit.architectures.default_layer`).

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
        f"no CAM layer found automatically in {type(model).__name__} for this {x.shape[-2]}x{x.shape[-1]} "
        f"input: {reason}. Pass layer= explicitly (see camkit.list_layers(model, x))."
    )


def list_layers(model: nn.Module, example_input: Tensor | None = None) -> list[LayerInfo]:
    """List the model's named modules, with output shapes when an example input is given.

    With an input, modules appear in the order their calls finish in a forward pass
    (a module called twice appears twice); modules that did not run are left out.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit import list_layers
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        >>> [(i.name, i.output_shape) for i in list_layers(net, torch.zeros(1, 3, 5, 5))]
        [('0', (1, 4, 3, 3)), ('1', (1, 4, 3, 3))]
    """
    if example_input is None:
        return [LayerInfo(n, type(m).__name__, None) for n, m in _names(model).items()]
    return [LayerInfo(n, type(m).__name__, _shape(o)) for n, m, o in _trace(model, example_input)]
