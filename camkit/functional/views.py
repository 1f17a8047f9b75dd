"""Attribution views on tensors: sign modes, outlier clipping, heat maps, blends, masks.

Pixel attributions (Saliency, Integrated Gradients...) are signed and heavy-tailed: min-max
normalising their absolute value shows a few bright specks. These functions choose a sign,
clip the heaviest outliers and scale what is left, then draw one of four views, all batched
and on the attributions' device (no numpy round trip). The same calls work on CAM maps
[B, H, W] in [0, 1].

Ranks: the pictures (heat maps, blends, masks) are drawn for images. The scaling itself is
pure math and works on any rank: :func:`scale_attribution` takes ``spatial_dims=`` (1 for a
signal, 3 for a volume or a video) and :func:`outlier_threshold` reads any [B, ...]. The
picture functions refuse attributions of a signal, a volume or a video with a message that
says what to draw instead (one frame or slice).

Scaling (the convention of captum's ``visualize_image_attr``): channels are summed, the
sign mode is applied (``positive`` keeps ``max(a, 0)``, ``negative`` keeps ``min(a, 0)``,
``absolute_value`` takes ``|a|``, ``all`` keeps ``a``), then every value is divided by a
threshold ``t`` and clipped to [-1, 1]. ``t`` is the smallest ``|a|`` such that the values
of magnitude at most ``t`` hold ``100 - outlier_perc`` percent of the map's total magnitude
``sum |a|``: the outliers are the largest values making up the last ``outlier_perc`` percent
of the *mass*, not of the pixel count. ``negative`` maps come out non-negative (``a / -t``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InvalidInputError
from .maps import upsample_maps
from .overlay import colorize

__all__ = [
    "SIGNS",
    "VIEWS",
    "alpha_scaling",
    "attribution_view",
    "blended_heat_map",
    "heat_map",
    "masked_image",
    "outlier_threshold",
    "scale_attribution",
]

SIGNS: tuple[str, ...] = ("positive", "negative", "absolute_value", "all")
VIEWS: tuple[str, ...] = ("heat_map", "blended_heat_map", "masked_image", "alpha_scaling")
# Default colormap per sign: diverging for signed maps, white -> colour for one sign.
DEFAULT_COLORMAP = {"all": "bwr", "positive": "reds", "negative": "blues", "absolute_value": "inferno"}


_MAPS = {1: "[B, T]", 2: "[B, H, W]", 3: "[B, D, H, W]"}
_ATTRS = {1: "[B, C, T]", 2: "[B, C, H, W]", 3: "[B, C, D, H, W]"}


def _as_maps(attr: Tensor, spatial_dims: int = 2) -> Tensor:
    """[B, *S] as it is; [B, C, *S] summed over channels (``spatial_dims`` axes S)."""
    if isinstance(spatial_dims, bool) or spatial_dims not in _MAPS:
        raise InvalidInputError(
            f"spatial_dims must be 1 (a signal), 2 (an image) or 3 (a volume or a video), got {spatial_dims!r}"
        )
    if attr.dim() == spatial_dims + 1:
        return attr.float()
    if attr.dim() == spatial_dims + 2:
        return attr.float().sum(dim=1)
    hint = "for one image add a batch dimension (attr[None])"
    if spatial_dims == 2 and attr.dim() == 5:
        hint = (
            "a volume or a video? pass spatial_dims=3 to scale it; pictures of volumes and videos are not drawn "
            "here yet: draw one slice or frame, e.g. attr[:, :, d]"
        )
    elif spatial_dims != 2:
        hint = "for one input add a batch dimension (attr[None])"
    raise InvalidInputError(
        f"attributions must be {_MAPS[spatial_dims]} or {_ATTRS[spatial_dims]}, got shape {list(attr.shape)}; {hint}"
    )


def _check_picture(attr: Tensor) -> None:
    """Refuse attributions that are not an image's, saying what to draw instead.

    A signal's attributions [B, C, T] cannot be told from an image's maps [B, H, W] by shape:
    they are drawn as a C x T picture.
    """
    if attr.dim() == 5:
        raise InvalidInputError(
            f"attribution pictures are drawn for images, [B, H, W] or [B, C, H, W]; got shape {list(attr.shape)} "
            "(a volume or a video?): draw one slice or frame, e.g. attr[:, :, d] for depth or time d, or scale the "
            "whole of it with scale_attribution(attr, spatial_dims=3)"
        )
    if attr.dim() == 2:
        raise InvalidInputError(
            f"attribution pictures are drawn for images, [B, H, W] or [B, C, H, W]; got shape {list(attr.shape)} "
            "(a batch of signal maps [B, T]?): scale it with scale_attribution(attr, spatial_dims=1) and plot it "
            "as a curve"
        )


def _check_sign(sign: str) -> None:
    if sign not in SIGNS:
        raise InvalidInputError(f"sign must be one of {', '.join(SIGNS)}; got {sign!r}")


def outlier_threshold(values: Tensor, outlier_perc: float = 2.0) -> Tensor:
    """Per map, the magnitude above which the largest ``outlier_perc`` percent of the mass lies.

    Args:
        values: non-negative [B, ...]: maps of any rank ([B, T], [B, H, W], [B, D, H, W]) or [B, N].
        outlier_perc: percent of each map's total mass counted as outliers, in [0, 100).

    Returns:
        [B]: the smallest value ``t`` of the map such that the values ``<= t`` sum to at least
        ``(100 - outlier_perc) / 100`` of the map's total; 0 for an all-zero map.

    Example:
        >>> import torch
        >>> from camkit.functional import outlier_threshold
        >>> # total 10; half the mass (5) is reached at the sorted values 1 + 2 + 3 = 6 >= 5
        >>> outlier_threshold(torch.tensor([[4.0, 1.0, 3.0, 2.0]]), outlier_perc=50).tolist()
        [3.0]
    """
    if not 0.0 <= outlier_perc < 100.0:
        raise InvalidInputError(f"outlier_perc must be in [0, 100), got {outlier_perc}")
    if values.dim() < 2:
        raise InvalidInputError(f"values must be [B, ...], got shape {list(values.shape)}")
    flat = values.detach().float().reshape(values.shape[0], -1)
    ordered = flat.sort(dim=1).values
    mass = ordered.cumsum(dim=1)
    goal = mass[:, -1:] * (1.0 - outlier_perc / 100.0)
    index = torch.searchsorted(mass, goal).clamp(max=flat.shape[1] - 1)  # first index with mass >= goal
    return ordered.gather(1, index)[:, 0]


def scale_attribution(
    attr: Tensor, sign: str = "absolute_value", outlier_perc: float = 2.0, *, spatial_dims: int = 2
) -> Tensor:
    """Apply a sign mode, clip the outliers and scale: [B, *S] in [-1, 1] (``all``) or [0, 1].

    Args:
        attr: attributions [B, C, *S] (channels are summed) or maps [B, *S].
        sign: ``"positive"``, ``"negative"``, ``"absolute_value"`` or ``"all"`` (see the module).
        outlier_perc: percent of the mass clipped as outliers (captum's default: 2).
        spatial_dims: the number of spatial axes S: 2 for images (the default; [B, C, H, W] or
            [B, H, W]), 1 for signals ([B, C, T] or [B, T]), 3 for volumes and videos
            ([B, C, D, H, W] or [B, D, H, W]). The outliers are counted over the whole map.

    Returns:
        float32 [B, *S] on ``attr``'s device; ``negative`` gives the magnitude of the negative
        part in [0, 1]; an all-zero map (after the sign mode) gives zeros.

    Example:
        >>> import torch
        >>> from camkit.functional import scale_attribution
        >>> a = torch.tensor([[[1.0, -2.0, 3.0, -4.0]]])
        >>> (scale_attribution(a, "all", outlier_perc=50) * 3).tolist()  # |a| total 10; t = 3
        [[[1.0, -2.0, 3.0, -3.0]]]
        >>> scale_attribution(a, "negative", outlier_perc=0).tolist()  # t = 4
        [[[0.0, 0.5, 0.0, 1.0]]]
        >>> scale_attribution(torch.tensor([[[1.0, -2.0], [3.0, 2.0]]]), "all", 0, spatial_dims=1).tolist()  # [B, C, T]
        [[1.0, 0.0]]
    """
    _check_sign(sign)
    maps = _as_maps(attr, spatial_dims)
    if sign == "positive":
        maps = maps.clamp(min=0)
    elif sign == "negative":
        maps = (-maps).clamp(min=0)
    elif sign == "absolute_value":
        maps = maps.abs()
    threshold = outlier_threshold(maps.abs(), outlier_perc).view(-1, *([1] * (maps.dim() - 1)))
    zero = threshold <= 0
    scaled = maps / torch.where(zero, torch.ones_like(threshold), threshold)
    low = -1.0 if sign == "all" else 0.0
    return torch.where(zero, torch.zeros_like(scaled), scaled.clamp(low, 1.0))


def _image_like(images: Tensor, maps: Tensor) -> Tensor:
    """Images as float [B, 3, H, W] in [0, 1], checked against the maps' batch."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise InvalidInputError(f"images must be [B, 3, H, W], got shape {list(images.shape)}")
    if images.shape[0] != maps.shape[0]:
        raise InvalidInputError(
            f"images and attributions must have the same batch size, got {images.shape[0]} and {maps.shape[0]}"
        )
    if images.dtype == torch.uint8:
        return images.float() / 255
    return images.float().clamp(0, 1)


def _to_uint8(x: Tensor) -> Tensor:
    return (x * 255).round().clamp(0, 255).to(torch.uint8)


def _colour(scaled: Tensor, sign: str, colormap: str | None) -> Tensor:
    """Colour scaled maps [B, H, W]: signed ones from [-1, 1], the others from [0, 1]."""
    name = colormap or DEFAULT_COLORMAP[sign]
    position = (scaled + 1) / 2 if sign == "all" else scaled
    return colorize(position, name).float() / 255


def heat_map(
    attr: Tensor, sign: str = "absolute_value", outlier_perc: float = 2.0, colormap: str | None = None
) -> Tensor:
    """The scaled attribution coloured by a colormap: uint8 RGB [B, 3, H, W].

    Signed maps (``sign="all"``) are coloured from -1 (index 0) to 1 (index 255), so zero is the
    colormap's middle (white in ``bwr``, the default); one-sign maps from 0 to 1 (defaults:
    ``reds`` for positive, ``blues`` for negative, ``inferno`` for absolute value).

    Example:
        >>> import torch
        >>> from camkit.functional import heat_map
        >>> out = heat_map(torch.tensor([[[-1.0, 0.0, 1.0]]]), sign="all", outlier_perc=0)
        >>> out[0, :, 0].T.tolist()  # blue, white (index 128 of 256), red
        [[0, 0, 255], [255, 254, 254], [255, 0, 0]]
    """
    _check_picture(attr)
    return _to_uint8(_colour(scale_attribution(attr, sign, outlier_perc), sign, colormap))


def blended_heat_map(
    images: Tensor,
    attr: Tensor,
    sign: str = "absolute_value",
    outlier_perc: float = 2.0,
    colormap: str | None = None,
    alpha: float = 0.5,
) -> Tensor:
    """The heat map over a grey copy of the image: ``(1 - alpha) * grey + alpha * colour``.

    ``grey`` is the mean of the image's three channels. Attributions at another size than the
    images are resized bilinearly (after scaling).

    Args:
        images: float [B, 3, H, W] in [0, 1] or uint8.
        attr: [B, C, h, w] or [B, h, w].
        alpha: the heat map's weight in [0, 1].

    Returns:
        uint8 RGB [B, 3, H, W].

    Example:
        >>> import torch
        >>> from camkit.functional import blended_heat_map
        >>> img = torch.tensor([[[[0.2]], [[0.4]], [[0.6]]]])  # grey 0.4
        >>> # "reds" at 1 is (0.8, 0, 0): 0.5 * 0.4 + 0.5 * (0.8, 0, 0) = (0.6, 0.2, 0.2)
        >>> blended_heat_map(img, torch.ones(1, 1, 1), "positive", 0, alpha=0.5)[0, :, 0, 0].tolist()
        [153, 51, 51]
    """
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1], got {alpha}")
    _check_picture(attr)
    scaled = scale_attribution(attr, sign, outlier_perc)
    base = _image_like(images, scaled)
    scaled = upsample_maps(scaled, (base.shape[-2], base.shape[-1]))
    grey = base.mean(dim=1, keepdim=True)
    return _to_uint8((1 - alpha) * grey + alpha * _colour(scaled, sign, colormap))


def _one_sign(sign: str, view: str) -> None:
    _check_sign(sign)
    if sign == "all":
        raise InvalidInputError(
            f"{view} needs one sign (positive, negative or absolute_value), got 'all': a mask cannot be "
            "both; use heat_map or blended_heat_map for signed attributions"
        )


def masked_image(images: Tensor, attr: Tensor, sign: str = "absolute_value", outlier_perc: float = 2.0) -> Tensor:
    """The image multiplied by the scaled attribution: ``image * s`` (black where ``s = 0``).

    Example:
        >>> import torch
        >>> from camkit.functional import masked_image
        >>> out = masked_image(torch.ones(1, 3, 1, 2), torch.tensor([[[1.0, 3.0]]]), "positive", 0)
        >>> out[0, 0].tolist()  # scaled by t = 3: [1/3, 1]
        [[85, 255]]
    """
    _one_sign(sign, "masked_image")
    _check_picture(attr)
    scaled = scale_attribution(attr, sign, outlier_perc)
    base = _image_like(images, scaled)
    scaled = upsample_maps(scaled, (base.shape[-2], base.shape[-1]))
    return _to_uint8(base * scaled[:, None])


def alpha_scaling(
    images: Tensor,
    attr: Tensor,
    sign: str = "absolute_value",
    outlier_perc: float = 2.0,
    background: float = 1.0,
) -> Tensor:
    """The image with opacity ``s`` over a plain background: ``s * image + (1 - s) * background``.

    Args:
        background: the grey level (0 black, 1 white) that shows where the attribution is low.

    Example:
        >>> import torch
        >>> from camkit.functional import alpha_scaling
        >>> out = alpha_scaling(torch.zeros(1, 3, 1, 2), torch.tensor([[[0.0, 2.0]]]), "positive", 0)
        >>> out[0, 0].tolist()  # white where s = 0, the (black) image where s = 1
        [[255, 0]]
    """
    _one_sign(sign, "alpha_scaling")
    if not 0.0 <= background <= 1.0:
        raise InvalidInputError(f"background must be in [0, 1], got {background}")
    _check_picture(attr)
    scaled = scale_attribution(attr, sign, outlier_perc)
    base = _image_like(images, scaled)
    s = upsample_maps(scaled, (base.shape[-2], base.shape[-1]))[:, None]
    return _to_uint8(s * base + (1 - s) * background)


def attribution_view(
    attr: Tensor,
    images: Tensor | None = None,
    view: str = "blended_heat_map",
    sign: str = "all",
    outlier_perc: float = 2.0,
    colormap: str | None = None,
    alpha: float = 0.5,
) -> Tensor:
    """One entry point for the four views (like captum's ``visualize_image_attr``, on tensors).

    The defaults differ from captum's (``heat_map`` of the ``absolute_value``): a signed heat map
    blended over the image shows both where the evidence is and which way it points.

    Args:
        attr: attributions [B, C, H, W] (e.g. ``explanation.raw`` of a pixel method) or maps
            [B, H, W] (e.g. a CAM's ``explanation.maps``).
        images: float [B, 3, H, W] in [0, 1] or uint8; needed by every view but ``heat_map``.
        view: ``"heat_map"``, ``"blended_heat_map"``, ``"masked_image"`` or ``"alpha_scaling"``.
        sign: ``"all"`` (diverging colours), ``"positive"``, ``"negative"`` or ``"absolute_value"``.
        outlier_perc: percent of each map's mass clipped as outliers.
        colormap: for the heat map views; default by sign (``bwr`` for ``all``).
        alpha: heat map weight of ``blended_heat_map``.

    Returns:
        uint8 RGB [B, 3, H, W] on the attributions' device.

    Example:
        >>> import torch
        >>> from camkit.functional import attribution_view
        >>> attribution_view(torch.randn(2, 3, 8, 8), torch.rand(2, 3, 8, 8)).shape
        torch.Size([2, 3, 8, 8])
    """
    if view not in VIEWS:
        raise InvalidInputError(f"view must be one of {', '.join(VIEWS)}; got {view!r}")
    if view == "heat_map":
        return heat_map(attr, sign, outlier_perc, colormap)
    if images is None:
        raise InvalidInputError(f"the {view} view draws on the images: pass images=[B, 3, H, W] in [0, 1]")
    if view == "blended_heat_map":
        return blended_heat_map(images, attr, sign, outlier_perc, colormap, alpha)
    if view == "masked_image":
        return masked_image(images, attr, sign, outlier_perc)
    return alpha_scaling(images, attr, sign, outlier_perc)
