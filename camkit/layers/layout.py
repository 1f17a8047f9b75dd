"""How a layer's output lies on the input: tokens, channel-first or channel-last maps.

CAM math needs channel-first grids ``[B, C, *s]`` with one axis per spatial axis of the input
(``[B, C, h, w]`` for an image, ``[B, C, t]`` for a signal, ``[B, C, d, h, w]`` for a volume
or a video). What follows is written for an image; other ranks follow the same rules with
their own number of axes. A layer gives one of:

* ``[B, C, h, w]`` (convolutions) or ``[B, h, w, C]`` (Swin, ConvNeXt's inner ``Linear``
  layers, ``Permute``): the layout is decided **from evidence**, in this order: the shape
  itself when only one reading fits the input's grid (:func:`camkit.functional.guess_channels_last`);
  when both fit, the module's type (:func:`camkit.layers.layout.known_channels_last`, which
  judges a container by its last block, not by the last leaf inside it); when nothing
  decides, an error asking for ``reshape=``.
* ``[B, N, D]`` tokens: prefix tokens (class, distillation, registers) dropped, the grid
  inferred from ``N`` and the input's aspect ratio (:func:`camkit.functional.infer_token_grid`),
  with the model's own prefix count when it says. For a signal, tokens ``[B, N, D]`` have the
  shape of a channel-first map: channel-first is read when its length fits the input, tokens
  when ``N`` (less a prefix) does. A model whose configuration fixes its grid or its token
  order (video transformers: a tubelet and patch size; TimeSformer's patch-major tokens) says
  so with a :class:`~camkit.layers.families.rule.TokenLayout` in place of a prefix count
  (:func:`prefix_token_hint`), and its tokens are read by it (:mod:`camkit.layers.token_layout`).

A grid of one position (``1 x 1``, after global pooling say) carries no spatial
information: it is refused, never stretched into a map.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Union

from torch import Tensor, nn

from ..errors import InvalidInputError
from ..functional.tokens import (
    channels_last_to_grid,
    grid_fits,
    guess_channels_last,
    infer_token_grid,
    tokens_to_grid,
)
from .defaults import unwrap_model
from .families import prefix_tokens, token_layout
from .families.torchvision import torchvision_tokens
from .token_layout import TokenLayout, layout_grid, layout_to_grid
from .video import ChannelsFirstVideo

__all__ = ["TokenLayout", "conv_ranks", "grid_shape", "known_channels_last", "layer_grid", "prefix_token_hint", "token_prefix"]

Reshape = Callable[[Tensor], Tensor]
#: What a model says about its tokens: a prefix count, or its whole :class:`TokenLayout`.
TokenHint = Union[int, TokenLayout, None]


def _count(hint: TokenHint) -> int | None:
    return hint.prefix if isinstance(hint, TokenLayout) else hint


def token_prefix(count: int, size: tuple[int, ...], hint: TokenHint) -> int | None:
    """The model's prefix-token count when it fits ``count`` tokens on the input, else ``None`` (infer).

    With a :class:`TokenLayout`, the prefix its grid leaves (:func:`camkit.layers.token_layout.layout_grid`).

    Example:
        >>> from camkit.layers.layout import token_prefix
        >>> token_prefix(197, (224, 224), 1), token_prefix(49, (224, 224), 1)
        (1, None)
    """
    if isinstance(hint, TokenLayout):
        fit = layout_grid(count, size, hint)
        if fit is not None:
            return fit[0]
        hint = hint.prefix
    if hint is None:
        return None
    try:
        infer_token_grid(count, size, prefix=hint)
    except InvalidInputError:
        return None  # the model's hint does not fit this layer (a pooled stage, say): infer instead
    return hint


def _channels_last(module: nn.Module, shape: tuple[int, ...], size: tuple[int, ...], conv_model: bool = False) -> bool:
    if len(size) != 2:
        # Signals and volumes: the type first, then a plain convolutional network's convention,
        # then the shape (a small channel count often fits as a length or a depth).
        known = known_channels_last(module)
        if known is not None:
            return known
        if conv_model:
            return False
    try:
        return guess_channels_last(shape, size)
    except InvalidInputError:
        known = known_channels_last(module)
        if known is None:
            raise
        return known


def _signal_layout(
    module: nn.Module, shape: tuple[int, ...], size: tuple[int, ...], hint: TokenHint, conv_model: bool = False
) -> str:
    """How a [B, d1, d2] output of a signal model lies: ``"first"``, ``"last"`` or ``"tokens"``.

    Unlike an image's, a signal's shape is weak evidence: almost any small channel count is the
    signal's length over some stride (6 is 32 / 5 rounded up), so a ``Conv1d`` output [B, 4, 30]
    on 64 samples would "fit" as [B, t, C]. So the module's type decides first (a ``Conv1d`` or a
    ``BatchNorm1d`` is channel-first, a ``Linear`` or a ``LayerNorm`` channel-last); then the
    shape, when only one reading fits (tokens after a prefix only with the model's own prefix
    count); then PyTorch's channel-first convention when none fits. Raises
    :class:`InvalidInputError` when both fit and nothing else decides.
    """
    hint = _count(hint)
    first = grid_fits(shape[2:], size)
    last = grid_fits(shape[1:2], size)
    # Tokens with prefix tokens only when the model says how many: a signal's length fits so many
    # counts that an inferred prefix would read almost any [B, N, D] output as tokens.
    tokens = not last and bool(hint) and token_prefix(shape[1], size, hint) is not None
    known = known_channels_last(module)
    if known is False:
        return "first"
    if known:
        return "tokens" if tokens else "last"
    if conv_model:
        return "first"  # a convolutional signal network: what its type does not say is channel-first
    if not first:
        return "last" if last else "tokens" if tokens else "first"
    if not (last or tokens):
        return "first"
    reading = "[B, t, C]" if last else "[B, N, D] tokens"
    raise InvalidInputError(
        f"the layer output {list(shape)} on a {size[0]}-sample signal fits both [B, C, t] and {reading}, and "
        f"its type ({type(module).__name__}) does not say which; pass reshape=lambda t: t for channel-first "
        "or reshape=lambda t: t.transpose(1, 2) for channel-last."
    )


def grid_shape(
    module: nn.Module,
    shape: tuple[int, ...],
    size: tuple[int, ...],
    prefix_hint: TokenHint = None,
    *,
    conv_model: bool = False,
) -> tuple[int, ...] | None:
    """The grid a layer output of ``shape`` lies on for an input of spatial size ``size``, or ``None``.

    A grid is a tuple with one entry per spatial axis of the input: ``(h, w)`` for an image,
    ``(t,)`` for a signal, ``(d, h, w)`` for a volume or a video.

    ``None`` when the output is not a map of the input (neither tokens nor a map with one axis
    per spatial axis, tokens that fit no grid, or a layout nothing decides). Used to qualify
    layers; it never raises. ``prefix_hint`` is what the model says about its tokens: a prefix
    count, or a :class:`TokenLayout` (whose grid wins; tokens of a model whose order is not
    row-major and that do not fit its grid are no map).

    Example:
        >>> from torch import nn
        >>> from camkit.layers.layout import grid_shape
        >>> grid_shape(nn.Conv2d(3, 512, 1), (2, 512, 7, 7), (224, 224))
        (7, 7)
        >>> grid_shape(nn.LayerNorm(768), (2, 197, 768), (224, 224), 1)
        (14, 14)
        >>> grid_shape(nn.Conv3d(3, 512, 1), (2, 512, 2, 7, 7), (16, 112, 112))
        (2, 7, 7)
        >>> grid_shape(nn.Linear(3, 4), (2, 10), (224, 224)) is None
        True
    """
    n = len(size)
    try:
        if len(shape) == 3 and n == 1:
            layout = _signal_layout(module, shape, size, prefix_hint, conv_model)
            if layout == "tokens":
                return tuple(infer_token_grid(shape[1], size, prefix=token_prefix(shape[1], size, prefix_hint))[1:])
            return (shape[1],) if layout == "last" else (shape[2],)
        if len(shape) == 3:
            if isinstance(prefix_hint, TokenLayout):
                fit = layout_grid(shape[1], size, prefix_hint)
                if fit is not None:
                    return fit[1]
                if prefix_hint.order is not None:
                    return None  # tokens in the model's own order that fit no grid of it: not readable
            _, *grid = infer_token_grid(shape[1], size, prefix=token_prefix(shape[1], size, prefix_hint))
            return tuple(grid)
        if len(shape) == n + 2:
            last = _channels_last(module, shape, size, conv_model)
            return tuple(shape[1:-1]) if last else tuple(shape[2:])
    except InvalidInputError:
        return None
    return None


def layer_grid(
    name: str,
    module: nn.Module,
    tensor: Tensor,
    size: tuple[int, ...],
    *,
    prefix_hint: TokenHint = None,
    conv_model: bool = False,
    reshape: Reshape | None = None,
    last_spatial: Callable[[], str | None] | None = None,
) -> Tensor:
    """Bring one layer's output (or its gradient) to a channel-first grid [B, C, *s].

    Args:
        name: the layer's dotted name, for messages.
        module: the layer (its type is evidence for the layout when the shape is ambiguous).
        tensor: its output or gradient.
        size: the input's spatial size: ``(H, W)``, ``(T,)`` or ``(D, H, W)``.
        prefix_hint: the model's own count of prefix tokens, if it says, or its
            :class:`TokenLayout` (:func:`prefix_token_hint`).
        reshape: the caller's own conversion; it overrides everything else.
        last_spatial: called only to word the error for a ``1 x 1`` grid: the name of the
            model's last layer with a spatial output.

    Raises:
        InvalidInputError: an output that is no map of the input, an ambiguous layout, or a
            ``1 x 1`` grid.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.layers.layout import layer_grid
        >>> layer_grid("norm", nn.LayerNorm(8), torch.zeros(2, 1 + 4 * 6, 8), (40, 60), prefix_hint=1).shape
        torch.Size([2, 8, 4, 6])
        >>> layer_grid("stage", nn.Sequential(nn.Linear(8, 8)), torch.zeros(2, 8, 8, 96), (64, 64)).shape
        torch.Size([2, 96, 8, 8])
    """
    n = len(size)
    want = _GRID_SHAPES[n]
    if reshape is not None:
        grid = reshape(tensor)
        if not isinstance(grid, Tensor) or grid.dim() != n + 2:
            got = list(grid.shape) if isinstance(grid, Tensor) else type(grid).__name__
            raise InvalidInputError(f"reshape= must return a tensor {want}, got {got} for layer '{name}'")
        return grid
    shape = tuple(tensor.shape)
    if tensor.dim() == 3 and n == 1:
        try:
            layout = _signal_layout(module, shape, size, prefix_hint, conv_model)
        except InvalidInputError as err:
            raise InvalidInputError(f"layer '{name}': {err}") from None
        if layout == "tokens":
            grid = tokens_to_grid(tensor, size, prefix=token_prefix(tensor.shape[1], size, prefix_hint))
        else:
            grid = channels_last_to_grid(tensor) if layout == "last" else tensor
    elif tensor.dim() == 3 and isinstance(prefix_hint, TokenLayout):
        grid = _laid_out(name, tensor, size, prefix_hint)
    elif tensor.dim() == 3:
        prefix = token_prefix(tensor.shape[1], size, prefix_hint)
        grid = tokens_to_grid(tensor, size, prefix=prefix)
    elif tensor.dim() == n + 2:
        try:
            last = _channels_last(module, shape, size, conv_model)
        except InvalidInputError as err:
            raise InvalidInputError(f"layer '{name}': {err}") from None
        grid = channels_last_to_grid(tensor) if last else tensor
    else:
        raise _no_map_error(name, tensor, n)
    if math.prod(grid.shape[2:]) == 1:
        raise _one_position_error(name, grid, size, last_spatial)
    return grid


def _no_map_error(name: str, tensor: Tensor, n: int) -> InvalidInputError:
    """The error for an output of a rank that is no map of an input with ``n`` spatial axes."""
    kinds = {1: "a signal [B, C, T]", 2: "an image [B, C, H, W]", 3: "a volume or video [B, C, D, H, W]"}[n]
    other = {1: "[B, t, C]", 2: "[B, h, w, C]", 3: "[B, d, h, w, C]"}[n]
    return InvalidInputError(
        f"layer '{name}' gives shape {list(tensor.shape)} for {kinds}; CAMs need {_GRID_SHAPES[n]} maps, "
        f"{other} maps or [B, N, D] tokens. Pick another layer (camkit.list_layers(model, x)) or pass reshape=."
    )


def _one_position_error(
    name: str, grid: Tensor, size: tuple[int, ...], last_spatial: Callable[[], str | None] | None
) -> InvalidInputError:
    """The error for a grid of one position (after global pooling), naming the last spatial layer if asked."""
    found = last_spatial() if last_spatial is not None else None
    hint = f"; the model's last layer with a spatial output here is '{found}'" if found else ""
    return InvalidInputError(
        f"layer '{name}' has a {'x'.join('1' * (grid.dim() - 2))} output on this {'x'.join(map(str, size))} "
        "input (after global pooling, or "
        f"an input too small for its stride): a map of one position says nothing about where{hint}. "
        "Pick an earlier layer or a larger input."
    )


def _laid_out(name: str, tensor: Tensor, size: tuple[int, ...], layout: TokenLayout) -> Tensor:
    # Tokens of a model that says how they lie: its grid, in its order; the generic reading
    # only for row-major tokens that do not fit it (a pooled stage, say).
    fit = layout_grid(tensor.shape[1], size, layout)
    if fit is not None:
        return layout_to_grid(tensor, fit[0], fit[1], layout.order)
    if layout.order is not None:
        raise InvalidInputError(
            f"layer '{name}' gives {tensor.shape[1]} tokens, which fit no grid of this model's token layout "
            f"on the {'x'.join(map(str, size))} input ({layout}), and its tokens are not in row-major order; "
            "pass reshape= a callable that turns them into [B, C, *grid]."
        )
    return tokens_to_grid(tensor, size, prefix=token_prefix(tensor.shape[1], size, layout.prefix))


_GRID_SHAPES = {1: "[B, C, t]", 2: "[B, C, h, w]", 3: "[B, C, d, h, w]"}

_CHANNELS_FIRST = {
    *(f"{kind}{n}d" for n in (1, 2, 3) for kind in (
        "Conv", "ConvTranspose", "BatchNorm", "InstanceNorm", "MaxPool", "AvgPool", "AdaptiveAvgPool",
        "AdaptiveMaxPool", "LazyConv",
    )),
    "SyncBatchNorm",
    "FrozenBatchNorm2d",
    "GroupNorm",
    "LayerNorm2d",
    "Conv3DSimple",
    "Conv2Plus1D",
    "Conv3DNoTemporal",
    "SkipConnection",  # MONAI: concatenates along the channel axis
    "CNBlock",
    "ConvNeXtBlock",
    "Bottleneck",
    "BasicBlock",
}
_CHANNELS_LAST = {"SwinTransformerBlock", "SwinTransformerBlockV2", "PatchMerging", "PatchMergingV2", "Linear"}


def _own_layout(module: nn.Module) -> bool | None:
    name = type(module).__name__
    if name in _CHANNELS_FIRST:
        return False
    if name in _CHANNELS_LAST:
        return True
    if name == "Permute":
        dims = list(getattr(module, "dims", []))
        if dims == [0, 2, 3, 1]:
            return True
        if dims == [0, 3, 1, 2]:
            return False
    if isinstance(module, nn.LayerNorm) and not name.endswith("2d"):
        return True  # nn.LayerNorm normalises the last dimension: features are last
    return None


def known_channels_last(module: nn.Module) -> bool | None:
    """Whether a module's 4-D output is channel-last, from its type; ``None`` when unknown.

    The module's own type decides first; an ``nn.Sequential`` (or ``ModuleList``) is judged
    by its last child, which is what it returns (element-wise modules skipped), followed down
    to a module of known type. Any other container is unknown: its forward may permute, so
    the last leaf inside it is no evidence (a ConvNeXt block ends with a ``Linear`` yet
    returns a channel-first map). Explainers use this only when the
    output's shape fits both layouts (see :mod:`camkit.layers.layout`).

    Example:
        >>> from torch import nn
        >>> from camkit.layers.layout import known_channels_last
        >>> known_channels_last(nn.LayerNorm(8)), known_channels_last(nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU()))
        (True, False)
        >>> known_channels_last(nn.ReLU()) is None
        True
    """
    while True:
        own = _own_layout(module)
        if own is not None:
            return own
        if not isinstance(module, (nn.Sequential, nn.ModuleList)):
            # Any other container may permute in its forward (Hugging Face's ConvNext layer
            # ends with a Linear, then permutes back): its registration order is no evidence.
            return None
        children = [child for child in module.children() if not _shape_keeping(child)]
        if not children:
            return None
        module = children[-1]


_SHAPE_KEEPING = {"Identity", "Dropout", "DropPath", "ReLU", "GELU", "SiLU", "Hardswish", "ReLU6", "Sigmoid"}


def _shape_keeping(module: nn.Module) -> bool:
    # Element-wise modules at the end of a container keep the layout of what came before.
    return type(module).__name__ in _SHAPE_KEEPING


def prefix_token_hint(model: nn.Module) -> TokenHint:
    """What a model says about its tokens: its count of leading non-patch tokens, or its :class:`TokenLayout`.

    A count: timm's ``num_prefix_tokens``; transformers' ViT / DeiT / CLIP vision / DINOv2 from
    class and config (:func:`camkit.layers.families.prefix_tokens`); 1 for torchvision's
    ``VisionTransformer`` itself (not subclasses, which may add registers). A
    :class:`TokenLayout` where the configuration also fixes the grid or the token order:
    transformers' VideoMAE, TimeSformer and ViViT (:func:`camkit.layers.families.token_layout`),
    torchvision's MViT (:func:`camkit.layers.families.torchvision.torchvision_tokens`). A model
    in :class:`camkit.layers.video.ChannelsFirstVideo` is asked through the wrapper.
    ``None`` when the model says nothing: the layout is inferred.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.layout import prefix_token_hint
        >>> net = nn.Identity(); net.num_prefix_tokens = 5
        >>> prefix_token_hint(net)
        5
    """
    model = unwrap_model(model)
    if isinstance(model, ChannelsFirstVideo):
        model = model.model
    count = getattr(model, "num_prefix_tokens", None)
    if isinstance(count, int) and count >= 0:
        return count
    layout = token_layout(model)  # transformers' video families, from their config
    if layout is not None:
        return layout
    count = prefix_tokens(model)  # transformers' ViT, DeiT, CLIP vision, DINOv2 (camkit.layers.families)
    if count is not None:
        return count
    return torchvision_tokens(model)  # torchvision's VisionTransformer, MViT


_CHANNEL_LAST_KINDS = ("LayerNorm", "Attention", "Permute", "Transformer", "Swin", "Mixer")


def conv_ranks(model: nn.Module) -> frozenset[int]:
    """The spatial ranks for which ``model`` is a plain convolutional network; empty for any other model.

    A model whose convolutions are all channel-first and which holds nothing that works on
    channel-last maps or tokens (no ``nn.LayerNorm``, no attention, no ``Permute``, no
    transformer or Swin block) computes every map channel-first. For such a model, on a signal
    or a volume, an output whose own type says nothing about its layout (a ``ReLU``, a block of
    the user's) is read channel-first even when its channel count also fits as a length or a
    depth: ``[B, 8, 32, 32, 32]`` on a 32-cube fits both ``[B, C, D, H, W]`` and
    ``[B, D, H, W, C]``, and a signal's small channel counts fit it as lengths. Images keep
    their rule (the shape decides, then the type): there both layouts rarely fit.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.layout import conv_ranks
        >>> sorted(conv_ranks(nn.Sequential(nn.Conv3d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))))
        [3]
        >>> sorted(conv_ranks(nn.Sequential(nn.Conv1d(1, 8, 3), nn.LayerNorm(8))))
        []
    """
    ranks: set[int] = set()
    for module in model.modules():
        name = type(module).__name__
        if isinstance(module, (nn.LayerNorm, nn.MultiheadAttention)) or any(k in name for k in _CHANNEL_LAST_KINDS):
            if name != "LayerNorm2d":  # timm's and torchvision's channel-first norm of ConvNeXt stems
                return frozenset()
        if isinstance(module, nn.modules.conv._ConvNd):
            for n in (1, 2, 3):
                if name.endswith(f"{n}d"):
                    ranks.add(n)
    return frozenset(ranks)
