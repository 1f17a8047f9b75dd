"""Whole graph or block by block: the memory a gradient attention method's whole-graph path takes, and the budget.

:class:`~camkit.CheferRollout` and :class:`~camkit.LeGrad` have two ways to the gradient at every
block's attention. The *whole-graph* path runs one forward that keeps every block's graph and takes
one backward (``torch.autograd.grad``) for all blocks at once: fewest kernel launches, the fastest
on a GPU, but it holds every block's activations and attention probabilities at once. The
*block-by-block* path (:mod:`camkit.methods.attention.blockwise`) stays near a no-grad forward's
memory and pays a launch per block per few samples.

With ``path="auto"`` the explainer estimates the whole graph's memory from shapes alone (tokens,
heads, the blocks' layer widths, batch, dtype: :func:`whole_graph_bytes`), before anything runs,
and takes the whole graph when the estimate fits the budget: ``max_memory=`` bytes when given,
else, on CUDA, :data:`MARGIN` of the memory free on the device (:func:`free_memory`: the driver's
free memory plus what PyTorch's caching allocator holds unused, read without waiting for the
device). Without ``max_memory=`` on any other device (the CPU included), the block-by-block path.
Nothing here reads a tensor's values: the choice makes no host sync.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import InvalidInputError

__all__ = ["MARGIN", "PATHS", "GraphShape", "PathChoice", "choose_path", "free_memory", "graph_shape",
           "memory_option", "path_option", "token_count", "whole_graph_bytes"]  # fmt: skip

#: the spellings of ``path=``: decide by the memory budget, or force one path
PATHS = ("auto", "whole", "blockwise")
#: the share of the device's free memory the whole graph may fill when no ``max_memory=`` is given
MARGIN = 0.8
# per sample and block, attention-sized tensors [heads, N, N] held at once besides the saved activations: the
# saved probabilities and their gradient (every block's, until the relevance is taken)
_HELD = 2
# transient attention-sized tensors of the block being run or differentiated (logits before the softmax, the
# gradient of the logits, the weighted attention of one block)
_TRANSIENT = 3


def path_option(path: object) -> str:
    """``path`` when it is one of :data:`PATHS`; an :class:`~camkit.errors.InvalidInputError` otherwise.

    Example:
        >>> path_option("whole")
        'whole'
    """
    if not isinstance(path, str) or path not in PATHS:
        raise InvalidInputError(f"path must be one of {', '.join(map(repr, PATHS))}, got {path!r}")
    return path


def memory_option(max_memory: object) -> int | None:
    """``max_memory`` as a count of bytes (``None`` stays ``None``); an error for anything but a positive integer.

    Example:
        >>> memory_option(2 * 2**30), memory_option(None)
        (2147483648, None)
    """
    if max_memory is None:
        return None
    if isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory <= 0:
        raise InvalidInputError(f"max_memory must be a positive number of bytes (an int) or None, got {max_memory!r}")
    return max_memory


# a patch embedding's convolution: kernel, stride, padding, dilation per axis
Patch = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class GraphShape:
    """What a transformer's graph weighs per token, read once from its modules.

    ``heads``: per attention module, its heads; ``widths``: per block, the elements autograd keeps per
    token (the inputs and outputs of its linear layers, twice the width of its norms); ``patch``: the
    patch embedding's convolution (kernel, stride, padding, dilation per axis), or ``None``; ``prefix``:
    the tokens before the patches; ``itemsize``: bytes per element of the model's floating parameters.
    """

    heads: tuple[int, ...]
    widths: tuple[int, ...]
    patch: Patch | None
    prefix: int
    itemsize: int


def _heads(module: nn.Module) -> int | None:
    for name in ("num_heads", "num_attention_heads"):
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(getattr(module, "config", None), "num_attention_heads", None)
    return value if isinstance(value, int) and value > 0 else None


def _width(block: nn.Module) -> int:
    """Elements kept per token for one block's backward: its linear layers' inputs and outputs, its norms' twice."""
    width = 0
    for module in block.modules():
        if isinstance(module, nn.Linear):
            width += module.in_features + module.out_features
        elif isinstance(module, nn.MultiheadAttention):  # its packed input projection (out_proj is a Linear)
            width += 4 * module.embed_dim
        elif isinstance(module, nn.LayerNorm) or type(module).__name__.endswith(("RMSNorm", "LayerNorm")):
            weight = getattr(module, "weight", None)
            width += 2 * (math.prod(module.normalized_shape) if isinstance(module, nn.LayerNorm)
                          else weight.numel() if isinstance(weight, torch.Tensor) else 0)
    return width


def _patch(model: nn.Module) -> Patch | None:
    """The first convolution's geometry (a ViT's patch embedding; a hybrid's stem over-counts the tokens, which
    only makes the estimate larger); ``None`` without one or with a padding given by name."""
    for module in model.modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            if not isinstance(module.padding, tuple):
                return None
            return tuple(module.kernel_size), tuple(module.stride), tuple(module.padding), tuple(module.dilation)
    return None


def graph_shape(model: nn.Module, attentions: Sequence[nn.Module], blocks: Sequence[nn.Module] | None,
                prefix: int | None) -> GraphShape | None:
    """The :class:`GraphShape` of ``model`` (its attention modules, their blocks, its prefix tokens); ``None``
    where the heads of an attention module or the blocks are not known."""
    heads = [_heads(module) for module in attentions]
    if blocks is None or any(h is None for h in heads):
        return None
    floats = [p for p in model.parameters() if p.is_floating_point()]
    itemsize = max((p.element_size() for p in floats), default=4)
    return GraphShape(tuple(h for h in heads if h is not None), tuple(_width(b) for b in blocks), _patch(model),
                      prefix or 0, itemsize)


def token_count(shape: GraphShape, spatial: Sequence[int]) -> int | None:
    """The tokens a block sees for an input of ``spatial`` size: patches plus prefix; ``None`` if unknown.

    Example:
        >>> shape = GraphShape((2,), (80,), ((16, 16), (16, 16), (0, 0), (1, 1)), 1, 4)
        >>> token_count(shape, (224, 224))
        197
    """
    if shape.patch is None or len(shape.patch[0]) != len(spatial):
        return None
    kernel, stride, padding, dilation = shape.patch
    patches = math.prod((s + 2 * p - d * (k - 1) - 1) // t + 1 for s, k, t, p, d in zip(spatial, kernel, stride, padding, dilation))
    return patches + shape.prefix if patches > 0 else None


def whole_graph_bytes(shape: GraphShape, batch: int, spatial: Sequence[int]) -> int | None:
    """The whole-graph path's memory in bytes for ``batch`` inputs of ``spatial`` size, from shapes alone.

    Every block keeps its activations (:attr:`GraphShape.widths` per token) and ``_HELD``
    attention-sized tensors ``[heads, N, N]``, and the block being run or differentiated ``_TRANSIENT``
    more and its widest activations again; ``None`` where the tokens are not known.

    Example:
        >>> shape = GraphShape((12,) * 12, (15360,) * 12, ((16, 16), (16, 16), (0, 0), (1, 1)), 1, 4)
        >>> round(whole_graph_bytes(shape, 8, (224, 224)) / 2**20)  # vit_b_16 at batch 8, float32, in MiB
        1584
    """
    tokens = token_count(shape, spatial)
    if tokens is None or not shape.heads:
        return None
    square = tokens * tokens
    held = sum(w * tokens + _HELD * h * square for w, h in zip(shape.widths, shape.heads))
    transient = _TRANSIENT * max(shape.heads) * square + max(shape.widths) * tokens
    return batch * (held + transient) * shape.itemsize


def free_memory(device: torch.device) -> int | None:
    """Bytes the device can still give: on CUDA the driver's free memory (``torch.cuda.mem_get_info``, a driver
    query, not a stream synchronisation) plus what the caching allocator holds unused (its host-side counters);
    ``None`` elsewhere."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(0, int(cached))


@dataclass(frozen=True)
class PathChoice:
    """Which path a call takes (``path``: ``"whole"`` or ``"blockwise"``), with the whole graph's estimated bytes
    and the budget it was held to (``None``: not known, or no budget on this device)."""

    path: str
    estimate: int | None
    budget: int | None

    def extras(self, taken: str) -> dict[str, object]:
        """What an explanation reports: the path ``taken`` (which may differ from the one chosen where the blocks
        cannot be called again), the estimate and the budget."""
        return {"path": taken, "estimated_bytes": self.estimate, "budget_bytes": self.budget}


def choose_path(path: str, estimate: int | None, max_memory: int | None, device: torch.device) -> PathChoice:
    """The path for ``path`` (one of :data:`PATHS`) given the whole graph's ``estimate``.

    ``"auto"``: the whole graph where the estimate is known and fits the budget (``max_memory``, or
    :data:`MARGIN` of :func:`free_memory` on CUDA); the block-by-block path otherwise, and on a device
    without a budget.

    Example:
        >>> cpu = torch.device("cpu")
        >>> choose_path("auto", 10**9, None, cpu).path, choose_path("auto", 10**9, 2 * 10**9, cpu).path
        ('blockwise', 'whole')
        >>> choose_path("whole", None, None, cpu).path
        'whole'
    """
    if max_memory is not None:
        budget: int | None = max_memory
    else:
        free = free_memory(device) if path == "auto" else None
        budget = None if free is None else int(MARGIN * free)
    if path != "auto":
        return PathChoice(path, estimate, budget)
    fits = estimate is not None and budget is not None and estimate <= budget
    return PathChoice("whole" if fits else "blockwise", estimate, budget)
