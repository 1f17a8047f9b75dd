"""Perturbation methods: the model's score on masked or occluded inputs, without gradients."""

from .occlusion import RISE, Occlusion
from .regions import FeatureAblation, KernelShap, Lime, RegionAttribution, ShapleyValueSampling

__all__ = ["RISE", "FeatureAblation", "KernelShap", "Lime", "Occlusion", "RegionAttribution", "ShapleyValueSampling"]
