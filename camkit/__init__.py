"""camkit: see what PyTorch image models look at.

The public API is flat: explainers (``camkit.GradCAM`` ...), the registry
(``camkit.get_method``), layers and targets helpers, overlays and image IO.
Pure tensor math lives in :mod:`camkit.functional`; the hook layer in :mod:`camkit.hooks`.
"""

from ._version import __version__
from .architectures import default_layer, unwrap_model
from .audit import audit
from .debug.features import extract_features
from .errors import (
    CamkitError,
    CamkitWarning,
    InferenceModeError,
    InvalidInputError,
    InvalidTargetError,
    LayerNotFoundError,
    LayerNotReachedError,
    NoReLUWarning,
    NoRuleWarning,
    OutputSelectionError,
    UnknownMethodError,
)
from .explanation import Explanation
from .hooks import HookScope, LayerCapture
from .io import load_image, read_rgb, save_png, to_tensor
from .layers import auto_layer, list_layers, resolve_layers
from .methods import (
    CAM,
    LRP,
    RISE,
    AblationCAM,
    AugSmooth,
    CAMExplainer,
    Deconvolution,
    DeepLift,
    DeepLiftShap,
    EigenCAM,
    EigenGradCAM,
    Explainer,
    GradCAM,
    GradCAMPlusPlus,
    GradientAttribution,
    GradientCAM,
    GradientShap,
    GuidedBackprop,
    GuidedGradCAM,
    HiResCAM,
    InputXGradient,
    IntegratedGradients,
    LayerCAM,
    Occlusion,
    Saliency,
    ScoreCAM,
    SmoothGrad,
    XGradCAM,
)
from .modelload import ModelLoadError, load_model
from .overlay import overlay, to_uint8_rgb
from .registry import get_method, list_methods, register_method
from .target_fns import BinaryTarget, DetectionTarget, RegressionTarget, SegmentationTarget, SimilarityTarget
from .targets import resolve_target, select_output

__all__ = [
    "CAM",
    "LRP",
    "RISE",
    "AblationCAM",
    "AugSmooth",
    "BinaryTarget",
    "CAMExplainer",
    "CamkitError",
    "CamkitWarning",
    "Deconvolution",
    "DeepLift",
    "DeepLiftShap",
    "DetectionTarget",
    "EigenCAM",
    "EigenGradCAM",
    "Explainer",
    "Explanation",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientAttribution",
    "GradientCAM",
    "GradientShap",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "HookScope",
    "InferenceModeError",
    "InputXGradient",
    "IntegratedGradients",
    "InvalidInputError",
    "InvalidTargetError",
    "LayerCAM",
    "LayerCapture",
    "LayerNotFoundError",
    "LayerNotReachedError",
    "ModelLoadError",
    "NoReLUWarning",
    "NoRuleWarning",
    "Occlusion",
    "OutputSelectionError",
    "RegressionTarget",
    "Saliency",
    "ScoreCAM",
    "SegmentationTarget",
    "SimilarityTarget",
    "SmoothGrad",
    "UnknownMethodError",
    "XGradCAM",
    "__version__",
    "audit",
    "auto_layer",
    "default_layer",
    "extract_features",
    "get_method",
    "list_layers",
    "list_methods",
    "load_image",
    "load_model",
    "overlay",
    "read_rgb",
    "register_method",
    "resolve_layers",
    "resolve_target",
    "save_png",
    "select_output",
    "to_tensor",
    "to_uint8_rgb",
    "unwrap_model",
]
