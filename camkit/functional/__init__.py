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
from .propagation import gamma_params, relevance_gradient, rescale_multiplier, split_by_sign, stabilize
from .tokens import channels_last_to_grid, guess_channels_last, infer_token_grid, tokens_to_grid

__all__ = [
    "aggregate_samples",
    "blur",
    "channels_last_to_grid",
    "colorize",
    "colormap_lut",
    "completeness_gap",
    "deconv_relu_grad",
    "gamma_params",
    "gradcam",
    "gradcam_weights",
    "gradcampp_weights",
    "guess_channels_last",
    "guided_relu_grad",
    "hirescam",
    "infer_token_grid",
    "integration_points",
    "layercam",
    "normalize_maps",
    "overlay_batch",
    "reduce_channels",
    "relevance_gradient",
    "rescale_multiplier",
    "split_by_sign",
    "stabilize",
    "tokens_to_grid",
    "upsample_maps",
    "weighted_sum",
    "xgradcam_weights",
]
