"""Class activation maps: a layer's activations weighed per channel, by gradients, scores or the activations alone."""

from .cam import CAM
from .dff import DeepFeatureFactorization, factorization_image
from .eigen import EigenCAM, EigenGradCAM, SegEigenCAM
from .from_activations import FEM, KPCACAM, RandomCAM
from .fullgrad import FullGrad
from .gradcam import GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from .gradient_variants import FinerCAM, GradCAMElementWise, ShapleyCAM
from .score_averaged import ISCAM, SSCAM
from .scorecam import AblationCAM, ScoreCAM

__all__ = [
    "CAM",
    "FEM",
    "ISCAM",
    "KPCACAM",
    "SSCAM",
    "AblationCAM",
    "DeepFeatureFactorization",
    "EigenCAM",
    "EigenGradCAM",
    "FinerCAM",
    "FullGrad",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "HiResCAM",
    "LayerCAM",
    "RandomCAM",
    "ScoreCAM",
    "SegEigenCAM",
    "ShapleyCAM",
    "XGradCAM",
    "factorization_image",
]
