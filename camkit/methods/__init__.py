"""Explainer classes, one module per method family."""

from .base import CAMExplainer, Explainer, GradientCAM
from .cam import CAM
from .eigen import EigenCAM, EigenGradCAM
from .gradcam import GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from .integrated import IntegratedGradients
from .perturbation import RISE, Occlusion
from .pixel import Deconvolution, GradientAttribution, GuidedBackprop, GuidedGradCAM, InputXGradient, Saliency
from .scorecam import AblationCAM, ScoreCAM
from .smooth import AugSmooth, SmoothGrad

# issue 18: propagation attributions (DeepLift, DeepLiftShap, GradientShap, LRP)
from .deeplift import DeepLift, DeepLiftShap
from .gradientshap import GradientShap
from .lrp import LRP

__all__ = [
    "LRP",
    "DeepLift",
    "DeepLiftShap",
    "GradientShap",
    "CAM",
    "RISE",
    "AblationCAM",
    "AugSmooth",
    "CAMExplainer",
    "Deconvolution",
    "EigenCAM",
    "EigenGradCAM",
    "Explainer",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientAttribution",
    "GradientCAM",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "InputXGradient",
    "IntegratedGradients",
    "LayerCAM",
    "Occlusion",
    "Saliency",
    "ScoreCAM",
    "SmoothGrad",
    "XGradCAM",
]
