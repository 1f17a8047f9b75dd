"""Explainer classes, one module per method family."""

from .attention import AttentionExplainer, AttentionRollout, CheferRollout, LeGrad
from .base import CAMExplainer, Explainer, GradientCAM
from .cam import CAM
from .cam_extra import FEM, KPCACAM, FinerCAM, FullGrad, GradCAMElementWise, RandomCAM, ShapleyCAM
from .concepts import ConceptReferences, ConceptRelevance
from .deeplift import DeepLift, DeepLiftShap
from .dff import DeepFeatureFactorization, factorization_image
from .eigen import EigenCAM, EigenGradCAM, SegEigenCAM
from .gradcam import GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from .gradientshap import GradientShap
from .integrated import IntegratedGradients
from .layer import (
    LayerActivation,
    LayerAttribution,
    LayerConductance,
    LayerGradientXActivation,
    LayerIntegratedGradients,
)
from .lrp import LRP
from .perturbation import RISE, Occlusion
from .pixel import Deconvolution, GradientAttribution, GuidedBackprop, GuidedGradCAM, InputXGradient, Saliency
from .refine import RefineCAM
from .regions import FeatureAblation, KernelShap, Lime, RegionAttribution, ShapleyValueSampling
from .score_averaged import ISCAM, SSCAM
from .scorecam import AblationCAM, ScoreCAM
from .sess import SESS
from .smooth import AugSmooth, SmoothGrad

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
    "AugSmooth",
    "CAMExplainer",
    "CheferRollout",
    "ConceptReferences",
    "ConceptRelevance",
    "Deconvolution",
    "DeepFeatureFactorization",
    "DeepLift",
    "DeepLiftShap",
    "EigenCAM",
    "EigenGradCAM",
    "Explainer",
    "FeatureAblation",
    "FinerCAM",
    "FullGrad",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GradientAttribution",
    "GradientCAM",
    "GradientShap",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "InputXGradient",
    "IntegratedGradients",
    "KernelShap",
    "LayerActivation",
    "LayerAttribution",
    "LayerCAM",
    "LayerConductance",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
    "LeGrad",
    "Lime",
    "Occlusion",
    "RandomCAM",
    "RefineCAM",
    "RegionAttribution",
    "Saliency",
    "ScoreCAM",
    "SegEigenCAM",
    "ShapleyCAM",
    "ShapleyValueSampling",
    "SmoothGrad",
    "XGradCAM",
    "factorization_image",
]
