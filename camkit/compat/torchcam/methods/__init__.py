"""torchcam 0.5.0's ``torchcam.methods`` on camkit's explainers."""

from .activation import CAM, ISCAM, SSCAM, ScoreCAM
from .core import OutputTarget
from .gradient import FinerCAM, GradCAM, GradCAMpp, LayerCAM, LeGrad, RefineCAM, SmoothGradCAMpp, XGradCAM

__all__ = [
    "CAM",
    "ISCAM",
    "SSCAM",
    "FinerCAM",
    "GradCAM",
    "GradCAMpp",
    "LayerCAM",
    "LeGrad",
    "OutputTarget",
    "RefineCAM",
    "ScoreCAM",
    "SmoothGradCAMpp",
    "XGradCAM",
]
