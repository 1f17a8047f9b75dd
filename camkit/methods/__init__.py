"""Explainer classes, one module per method family."""

from .base import CAMExplainer, Explainer, GradientCAM
from .gradcam import GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM

__all__ = [
    "CAMExplainer",
    "Explainer",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientCAM",
    "HiResCAM",
    "LayerCAM",
    "XGradCAM",
]
