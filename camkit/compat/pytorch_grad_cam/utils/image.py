"""pytorch-grad-cam's image helpers: preprocessing, overlays, and the CAM scaling, on camkit's map functions.

Images are numpy arrays [H, W, 3] as in the original (BGR or RGB as the caller has them);
none of these functions modifies its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ....errors import InvalidInputError
from ....functional.maps import normalize_maps, upsample_maps
from ....functional.overlay import colormap_lut
from ....methods.cam.dff import factorization_image

__all__ = [
    "create_labels_legend",
    "deprocess_image",
    "preprocess_image",
    "scale_accross_batch_and_channels",
    "scale_cam_image",
    "show_cam_on_image",
    "show_factorization_on_image",
]


def preprocess_image(
    img: np.ndarray, mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5)
) -> torch.Tensor:
    """An image [H, W, C] (uint8, scaled to [0, 1]; or float) as a normalised batch of one [1, C, H, W].

    Example:
        >>> import numpy as np
        >>> from camkit.compat.pytorch_grad_cam.utils.image import preprocess_image
        >>> preprocess_image(np.full((2, 2, 3), 255, np.uint8))[0, :, 0, 0].tolist()
        [1.0, 1.0, 1.0]
    """
    array = np.asarray(img)
    tensor = torch.from_numpy(array.copy())
    tensor = tensor.unsqueeze(-1) if tensor.dim() == 2 else tensor
    tensor = tensor.permute(2, 0, 1)
    tensor = tensor.float() / 255 if array.dtype == np.uint8 else tensor.float()
    m = torch.as_tensor(list(mean), dtype=torch.float32).view(-1, 1, 1)
    s = torch.as_tensor(list(std), dtype=torch.float32).view(-1, 1, 1)
    return ((tensor - m) / s).unsqueeze(0)


def deprocess_image(img: np.ndarray) -> np.ndarray:
    """A gradient image for display: standardised, scaled by 0.1 around 0.5, clipped, as uint8."""
    out = (img - np.mean(img)) / (np.std(img) + 1e-5)
    return (np.clip(out * 0.1 + 0.5, 0, 1) * 255).astype(np.uint8)


def _colormap_name(colormap: int | str) -> str:
    if isinstance(colormap, str):
        return colormap
    import cv2

    for name in dir(cv2):
        if name.startswith("COLORMAP_") and getattr(cv2, name) == colormap:
            return name[len("COLORMAP_") :].lower()
    raise InvalidInputError(f"colormap {colormap!r} is no OpenCV colormap code; pass e.g. cv2.COLORMAP_JET or 'jet'")


def show_cam_on_image(
    img: np.ndarray, mask: np.ndarray, use_rgb: bool = False, colormap: int | str = 2, image_weight: float = 0.5
) -> np.ndarray:
    """Blend a coloured CAM over an image: uint8 [H, W, 3], BGR unless ``use_rgb``.

    Args:
        img: float [H, W, 3] in [0, 1], in the channel order the result should have.
        mask: the CAM [H, W] in [0, 1].
        use_rgb: colour the heatmap in RGB (else BGR, OpenCV's order).
        colormap: an OpenCV colormap code (``cv2.COLORMAP_JET``, 2) or a name camkit knows.
        image_weight: the image's share in [0, 1].

    Example:
        >>> import numpy as np
        >>> from camkit.compat.pytorch_grad_cam.utils.image import show_cam_on_image
        >>> show_cam_on_image(np.zeros((1, 1, 3), np.float32), np.ones((1, 1)), use_rgb=True).tolist()
        [[[255, 0, 0]]]
    """
    if np.max(img) > 1:
        raise InvalidInputError(
            f"img must be float in [0, 1], got values up to {np.max(img)}; divide a uint8 image by 255 first"
        )
    if not 0 <= image_weight <= 1:
        raise InvalidInputError(f"image_weight must be in [0, 1], got {image_weight}")
    lut = colormap_lut(_colormap_name(colormap)).numpy()
    heat = lut[np.uint8(255 * np.asarray(mask))]  # RGB; the original truncates 255 * mask to uint8
    heat = np.float32(heat if use_rgb else heat[..., ::-1]) / 255
    cam = (1 - image_weight) * heat + image_weight * img
    return (255 * (cam / np.max(cam))).astype(np.uint8)


def create_labels_legend(concept_scores: np.ndarray, labels: dict[int, str], top_k: int = 2) -> list[str]:
    """One legend text per concept: its ``top_k`` categories as ``"name:score"`` lines (name: first 3 comma parts)."""
    texts = []
    for scores in np.asarray(concept_scores):
        best = np.argsort(scores)[::-1][:top_k]
        texts.append("\n".join(f"{','.join(labels[int(c)].split(',')[:3])}:{scores[c]:.2f}" for c in best))
    return texts


def _default_colors(count: int) -> list[np.ndarray]:
    import matplotlib

    cmap = matplotlib.colormaps[
        "gist_rainbow"
    ]  # plt.cm.get_cmap, which the original calls, is gone from matplotlib 3.9
    return [np.array(cmap(v)) for v in np.arange(0, 1, 1.0 / count)]


def _legend(result: np.ndarray, colors: Sequence[Any], labels: Sequence[str]) -> np.ndarray:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D

    height, width = result.shape[:2]
    dpi = plt.rcParams["figure.dpi"]
    fig = plt.figure(figsize=(width / dpi, height / dpi))
    try:
        size = int(14 * height / 256 / max(1, len(labels) / 6))
        lines = [Line2D([0], [0], color=c, lw=5 * height / 256) for c in colors]
        fig.legend(lines, list(labels), mode="expand", fancybox=True, shadow=True, fontsize=size, loc="center")
        fig.canvas.draw()
        panel = np.asarray(fig.canvas.buffer_rgba())[..., :3]  # type: ignore[attr-defined]
    finally:
        plt.close(fig)
    panel_t = torch.from_numpy(panel.copy()).permute(2, 0, 1).float()[None]
    panel_t = torch.nn.functional.interpolate(panel_t, size=(height, width), mode="bilinear", align_corners=False)
    return np.hstack([result, panel_t[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()])


def show_factorization_on_image(
    img: np.ndarray,
    explanations: np.ndarray,
    colors: Sequence[np.ndarray] | None = None,
    image_weight: float = 0.5,
    concept_labels: Sequence[str] | None = None,
) -> np.ndarray:
    """Colour each pixel by its strongest concept (:func:`camkit.factorization_image`); ``explanations`` untouched.

    ``img`` is float RGB [H, W, 3] in [0, 1], ``explanations`` [n, H, W] in [0, 1]. With
    ``concept_labels`` a legend panel is appended on the right, as in the original.
    """
    palette = _default_colors(len(explanations)) if colors is None else list(colors)
    image = torch.from_numpy(np.float32(img)).permute(2, 0, 1)
    result = factorization_image(
        image, np.asarray(explanations), colors=[list(c[:3]) for c in palette], image_weight=image_weight
    )
    return result if concept_labels is None else _legend(result, palette, concept_labels)


def scale_cam_image(cam: Any, target_size: Sequence[int] | None = None) -> np.ndarray:
    """Min-max normalise each map of ``cam`` [B, *s], then resize to ``target_size`` (``(W, H)`` or ``(W, H, D)``).

    Flat maps come back as zeros; the original divides by ``max + 1e-7``, which shrinks maps
    whose range is small (their values depend on the gradients' scale there), camkit by the range.

    Example:
        >>> import numpy as np
        >>> from camkit.compat.pytorch_grad_cam.utils.image import scale_cam_image
        >>> scale_cam_image(np.array([[[1.0, 3.0]]]), (4, 1)).tolist()
        [[[0.0, 0.25, 0.75, 1.0]]]
    """
    maps = torch.as_tensor(np.float32(np.asarray(cam)))
    n = maps.dim() - 1
    out, _ = normalize_maps(maps, spatial_dims=n)
    if target_size is not None:
        out = upsample_maps(out, tuple(int(s) for s in target_size)[::-1])
    return out.numpy().astype(np.float32)


def scale_accross_batch_and_channels(tensor: np.ndarray, target_size: Sequence[int]) -> np.ndarray:
    """:func:`scale_cam_image` on every map of [B, C, *s]: [B, C, *target_size reversed]."""
    batch, channels = tensor.shape[:2]
    scaled = scale_cam_image(np.asarray(tensor).reshape(batch * channels, *tensor.shape[2:]), target_size)
    return scaled.reshape(batch, channels, *scaled.shape[1:])
