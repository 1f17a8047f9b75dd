"""Attributions to the input or a layer: gradients (pixel, guided, integrated, GradientShap, layer
attributions) and relevance propagation (DeepLift, LRP, AttnLRP, concept relevance) with their rule helpers.
"""

from .attnlrp import AttnLRP
from .concepts import ConceptReferences, ConceptRelevance
from .deeplift import DeepLift, DeepLiftShap
from .gradientshap import GradientShap
from .integrated import IntegratedGradients
from .layer import (
    LayerActivation,
    LayerAttribution,
    LayerConductance,
    LayerGradientXActivation,
    LayerIntegratedGradients,
)
from .layer_deeplift import LayerDeepLift, LayerDeepLiftShap
from .lrp import LRP
from .pixel import Deconvolution, GradientAttribution, GuidedBackprop, GuidedGradCAM, InputXGradient, Saliency

__all__ = [
    "LRP",
    "AttnLRP",
    "ConceptReferences",
    "ConceptRelevance",
    "Deconvolution",
    "DeepLift",
    "DeepLiftShap",
    "GradientAttribution",
    "GradientShap",
    "GuidedBackprop",
    "GuidedGradCAM",
    "InputXGradient",
    "IntegratedGradients",
    "LayerActivation",
    "LayerAttribution",
    "LayerConductance",
    "LayerDeepLift",
    "LayerDeepLiftShap",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
    "Saliency",
]
