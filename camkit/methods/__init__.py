"""Explainer classes, one module per method family."""

from .base import CAMExplainer, Explainer, GradientCAM
from .cam import CAM
from .deeplift import DeepLift, DeepLiftShap
from .eigen import EigenCAM, EigenGradCAM
from .gradcam import GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from .gradientshap import GradientShap
from .integrated import IntegratedGradients
from .lrp import LRP
from .perturbation import RISE, Occlusion
from .pixel import Deconvolution, GradientAttribution, GuidedBackprop, GuidedGradCAM, InputXGradient, Saliency
from .scorecam import AblationCAM, ScoreCAM
from .smooth import AugSmooth, SmoothGrad

__all__ = [
    "CAM",
    "LRP",
    "RISE",
    "AblationCAM",
    "AugSmooth",
    "CAMExplainer",
    "Deconvolution",
    "DeepLift",
    "DeepLiftShap",
    "EigenCAM",
    "EigenGradCAM",
    "Explainer",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientAttribution",
    "GradientCAM",
    "GradientShap",
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
