"""torchcam 0.5.0's ``torchcam.methods`` on camkit's explainers."""

from .activation import CAM, ISCAM, SSCAM, ScoreCAM
from .core import OutputTarget
from .gradient import GradCAM, GradCAMpp, LayerCAM, SmoothGradCAMpp, XGradCAM

__all__ = [
    "CAM",
    "ISCAM",
    "SSCAM",
    "GradCAM",
    "GradCAMpp",
    "LayerCAM",
    "OutputTarget",
    "ScoreCAM",
    "SmoothGradCAMpp",
    "XGradCAM",
]
