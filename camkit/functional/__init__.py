"""Pure tensor functions behind the explainers: CAM math, map post-processing, overlays."""

from .cam import (
    gradcam,
    gradcam_weights,
    gradcampp_weights,
    hirescam,
    layercam,
    weighted_sum,
    xgradcam_weights,
)
from .maps import normalize_maps, upsample_maps
from .overlay import colorize, colormap_lut, overlay_batch

__all__ = [
    "colorize",
    "colormap_lut",
    "gradcam",
    "gradcam_weights",
    "gradcampp_weights",
    "hirescam",
    "layercam",
    "normalize_maps",
    "overlay_batch",
    "upsample_maps",
    "weighted_sum",
    "xgradcam_weights",
]
