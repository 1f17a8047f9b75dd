"""Explainers that wrap another explainer: smoothing over noisy or augmented copies, refinement, SESS."""

from .refine import RefineCAM
from .sess import SESS
from .smooth import AugSmooth, SmoothGrad

__all__ = ["SESS", "AugSmooth", "RefineCAM", "SmoothGrad"]
