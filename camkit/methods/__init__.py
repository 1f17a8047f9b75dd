"""Explainer classes, one module per method family."""

from .base import CAMExplainer, Explainer, GradientCAM
from .gradcam import GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from .integrated import IntegratedGradients
from .pixel import Deconvolution, GradientAttribution, GuidedBackprop, GuidedGradCAM, InputXGradient, Saliency
from .smooth import AugSmooth, SmoothGrad

__all__ = [
    "AugSmooth",
    "CAMExplainer",
    "Deconvolution",
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
    "Saliency",
    "SmoothGrad",
    "XGradCAM",
]
