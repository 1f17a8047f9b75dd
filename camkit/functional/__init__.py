"""Pure tensor functions behind the explainers: CAM math, map post-processing, overlays."""

from .attribution import (
    aggregate_samples,
    blur,
    completeness_gap,
    deconv_relu_grad,
    guided_relu_grad,
    integration_points,
    reduce_channels,
)
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
    "aggregate_samples",
    "blur",
    "colorize",
    "colormap_lut",
    "completeness_gap",
    "deconv_relu_grad",
    "gradcam",
    "gradcam_weights",
    "gradcampp_weights",
    "guided_relu_grad",
    "hirescam",
    "integration_points",
    "layercam",
    "normalize_maps",
    "overlay_batch",
    "reduce_channels",
    "upsample_maps",
    "weighted_sum",
    "xgradcam_weights",
]
