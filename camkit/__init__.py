"""camkit: see what PyTorch image models look at.

The public API is flat: explainers (``camkit.GradCAM`` ...), the registry
(``camkit.get_method``), layers and targets helpers, overlays and image IO. Behind it, one
wing per concern: :mod:`camkit.layers` (which layer, and how its output lies on the input),
:mod:`camkit.targets` (what is scored), :mod:`camkit.viz` (what people look at), pure tensor
math in :mod:`camkit.functional`, the hook layer in :mod:`camkit.hooks`, the explainers in
:mod:`camkit.methods`. CONTRIBUTING.md draws the map and says who may import whom.

``import camkit`` loads the explanation core only (explainers, targets, layers, hooks, image IO).
The apps and what they pull in (the audit, the evaluation, the explorer, model loading, the
debugging tools and the pictures, with matplotlib, scipy and scikit-learn behind them) load on
first use of their names (PEP 562): ``camkit.audit``, ``camkit.evaluate``, ``camkit.app``,
``camkit.load_model``, ``camkit.figure`` ... are there as before.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    CamkitError,
    CamkitWarning,
    CaptureWarning,
    InferenceModeError,
    InvalidInputError,
    InvalidTargetError,
    LayerNotFoundError,
    LayerNotReachedError,
    ModelLoadError,
    NoReLUWarning,
    NoRuleWarning,
    OutputSelectionError,
    UnknownMethodError,
    UnsupportedModelError,
)
from .explanation import Explanation
from .functional.views import attribution_view
from .hooks import HookScope, LayerCapture
from .io import denormalize, load_image, read_rgb, save_png, to_tensor, to_uint8_rgb
from .layers import ChannelsFirstVideo, auto_layer, default_layer, list_layers, resolve_layers, unwrap_model
from .methods import (
    CAM,
    FEM,
    ISCAM,
    KPCACAM,
    LRP,
    RISE,
    SESS,
    SSCAM,
    AblationCAM,
    AttentionExplainer,
    AttentionRollout,
    AttnLRP,
    AugSmooth,
    CAMExplainer,
    CheferRollout,
    ConceptReferences,
    ConceptRelevance,
    Deconvolution,
    DeepFeatureFactorization,
    DeepLift,
    DeepLiftShap,
    EigenCAM,
    EigenGradCAM,
    Explainer,
    FeatureAblation,
    FinerCAM,
    FullGrad,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    GradientAttribution,
    GradientCAM,
    GradientShap,
    GuidedBackprop,
    GuidedGradCAM,
    HiResCAM,
    InputXGradient,
    IntegratedGradients,
    KernelShap,
    LayerActivation,
    LayerCAM,
    LayerConductance,
    LayerDeepLift,
    LayerDeepLiftShap,
    LayerGradientXActivation,
    LayerIntegratedGradients,
    LeGrad,
    Lime,
    Occlusion,
    RandomCAM,
    RefineCAM,
    Saliency,
    ScoreCAM,
    SegEigenCAM,
    ShapleyCAM,
    ShapleyValueSampling,
    SmoothGrad,
    XGradCAM,
    factorization_image,
)
from .registry import get_method, list_methods, register_method
from .targets import (
    BinaryTarget,
    DetectionTarget,
    NeuronTarget,
    RegressionTarget,
    SegmentationTarget,
    SimilarityTarget,
    TokenTarget,
    resolve_target,
    select_output,
)

# Names whose modules load on first use: {name: module}.
_LAZY = {
    "ExplanationFigure": "camkit.viz",
    "GenerationExplanation": "camkit.vlm",
    "app": "camkit.explorer.entry",
    "audit": "camkit.audit",
    "evaluate": "camkit.evaluation",
    "explain_generation": "camkit.vlm",
    "extract_features": "camkit.debug.features",
    "figure": "camkit.viz",
    "load_model": "camkit.modelload",
    "overlay": "camkit.viz",
}

if TYPE_CHECKING:
    from .audit import audit
    from .debug.features import extract_features
    from .evaluation import evaluate
    from .explorer.entry import app
    from .modelload import load_model
    from .viz import ExplanationFigure, figure, overlay
    from .vlm import GenerationExplanation, explain_generation


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'camkit' has no attribute {name!r}")
    found = importlib.import_module(module)
    # camkit.audit is the callable package itself (calling it runs an audit), so that the function and
    # the package of the same name never shadow each other, whichever is imported first.
    value = found if module == f"camkit.{name}" else getattr(found, name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CAM",
    "FEM",
    "ISCAM",
    "KPCACAM",
    "LRP",
    "RISE",
    "SESS",
    "SSCAM",
    "AblationCAM",
    "AttentionExplainer",
    "AttentionRollout",
    "AttnLRP",
    "AugSmooth",
    "BinaryTarget",
    "CAMExplainer",
    "CamkitError",
    "CamkitWarning",
    "CaptureWarning",
    "ChannelsFirstVideo",
    "CheferRollout",
    "ConceptReferences",
    "ConceptRelevance",
    "Deconvolution",
    "DeepFeatureFactorization",
    "DeepLift",
    "DeepLiftShap",
    "DetectionTarget",
    "EigenCAM",
    "EigenGradCAM",
    "Explainer",
    "Explanation",
    "ExplanationFigure",
    "FeatureAblation",
    "FinerCAM",
    "FullGrad",
    "GenerationExplanation",
    "GradCAM",
    "GradCAMElementWise",
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
    "KernelShap",
    "LayerActivation",
    "LayerCAM",
    "LayerCapture",
    "LayerConductance",
    "LayerDeepLift",
    "LayerDeepLiftShap",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
    "LayerNotFoundError",
    "LayerNotReachedError",
    "LeGrad",
    "Lime",
    "ModelLoadError",
    "NeuronTarget",
    "NoReLUWarning",
    "NoRuleWarning",
    "Occlusion",
    "OutputSelectionError",
    "RandomCAM",
    "RefineCAM",
    "RegressionTarget",
    "Saliency",
    "ScoreCAM",
    "SegEigenCAM",
    "SegmentationTarget",
    "ShapleyCAM",
    "ShapleyValueSampling",
    "SimilarityTarget",
    "SmoothGrad",
    "TokenTarget",
    "UnknownMethodError",
    "UnsupportedModelError",
    "XGradCAM",
    "__version__",
    "app",
    "attribution_view",
    "audit",
    "auto_layer",
    "default_layer",
    "denormalize",
    "evaluate",
    "explain_generation",
    "extract_features",
    "factorization_image",
    "figure",
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
