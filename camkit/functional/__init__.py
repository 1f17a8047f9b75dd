"""Pure tensor functions behind the explainers: CAM math, map post-processing, overlays, views."""

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
    weighted_maps,
    weighted_sum,
    xgradcam_weights,
)
from .maps import flat_maps, normalize_maps, upsample_maps
from .overlay import colorize, colormap_lut, overlay_batch
from .tokens import channels_last_to_grid, guess_channels_last, infer_token_grid, tokens_to_grid
from .views import (
    alpha_scaling,
    attribution_view,
    blended_heat_map,
    heat_map,
    masked_image,
    outlier_threshold,
    scale_attribution,
)

__all__ = [
    "aggregate_samples",
    "alpha_scaling",
    "attribution_view",
    "blended_heat_map",
    "blur",
    "channels_last_to_grid",
    "colorize",
    "colormap_lut",
    "completeness_gap",
    "deconv_relu_grad",
    "flat_maps",
    "gradcam",
    "gradcam_weights",
    "gradcampp_weights",
    "guess_channels_last",
    "guided_relu_grad",
    "heat_map",
    "hirescam",
    "infer_token_grid",
    "integration_points",
    "layercam",
    "masked_image",
    "normalize_maps",
    "outlier_threshold",
    "overlay_batch",
    "reduce_channels",
    "scale_attribution",
    "tokens_to_grid",
    "upsample_maps",
    "weighted_maps",
    "weighted_sum",
    "xgradcam_weights",
]
