"""How to build every registered method on :class:`models.TinyNet` for the shared invariant tests.

Every key in ``camkit.list_methods()`` must have an entry here (a test enforces it).
A factory takes the model and returns a ready explainer; CAMs use layer ``"conv2"``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import camkit

FACTORIES: dict[str, Callable[[nn.Module], camkit.Explainer]] = {
    "gradcam": lambda m: camkit.GradCAM(m, "conv2"),
    "gradcam++": lambda m: camkit.GradCAMPlusPlus(m, "conv2"),
    "xgradcam": lambda m: camkit.XGradCAM(m, "conv2"),
    "hirescam": lambda m: camkit.HiResCAM(m, "conv2"),
    "layercam": lambda m: camkit.LayerCAM(m, "conv2"),
    "scorecam": lambda m: camkit.ScoreCAM(m, "conv2", batch_size=7),
    "ablationcam": lambda m: camkit.AblationCAM(
        m, "conv2", batch_size=7, tail=lambda a: m.fc(torch.flatten(m.pool(m.relu2(a)), 1))
    ),
    "eigencam": lambda m: camkit.EigenCAM(m, "conv2"),
    "eigengradcam": lambda m: camkit.EigenGradCAM(m, "conv2"),
    "cam": lambda m: camkit.CAM(m, "conv2"),
    "occlusion": lambda m: camkit.Occlusion(m, window=4, stride=2, batch_size=7),
    "rise": lambda m: camkit.RISE(m, masks=64, seed=0, grid=4, batch_size=7),
    "saliency": lambda m: camkit.Saliency(m),
    "inputxgradient": lambda m: camkit.InputXGradient(m),
    "guidedbackprop": lambda m: camkit.GuidedBackprop(m),
    "deconvolution": lambda m: camkit.Deconvolution(m),
    "guidedgradcam": lambda m: camkit.GuidedGradCAM(m, "conv2"),
    "integratedgradients": lambda m: camkit.IntegratedGradients(m, steps=8, max_batch=5),
    # issue 18: pytorch-grad-cam methods
    "gradcamelementwise": lambda m: camkit.GradCAMElementWise(m, "conv2"),
    "shapleycam": lambda m: camkit.ShapleyCAM(m, "conv2"),
    "finercam": lambda m: camkit.FinerCAM(m, "conv2", comparisons=2),
    "fem": lambda m: camkit.FEM(m, "conv2", k=1.0),
    "kpcacam": lambda m: camkit.KPCACAM(m, "conv2"),
    "randomcam": lambda m: camkit.RandomCAM(m, "conv2", seed=0),
    "fullgrad": lambda m: camkit.FullGrad(m),
    "dff": lambda m: camkit.DeepFeatureFactorization(m, "conv2", concepts=3, iterations=50),

    # issue 18: region and layer attributions
    "featureablation": lambda m: camkit.FeatureAblation(m, cells=4, batch_size=7),
    "shapleyvaluesampling": lambda m: camkit.ShapleyValueSampling(m, samples=3, cells=2, batch_size=7),
    "kernelshap": lambda m: camkit.KernelShap(m, samples=20, cells=3, batch_size=7),
    "lime": lambda m: camkit.Lime(m, samples=20, cells=3, batch_size=7),
    "layeractivation": lambda m: camkit.LayerActivation(m, "conv2"),
    "layergradientxactivation": lambda m: camkit.LayerGradientXActivation(m, "conv2"),
    "layerintegratedgradients": lambda m: camkit.LayerIntegratedGradients(m, "conv2", steps=6, max_batch=5),
    "layerconductance": lambda m: camkit.LayerConductance(m, "conv2", steps=6, max_batch=5),
    "layerdeeplift": lambda m: camkit.LayerDeepLift(m, "conv2"),
    "layerdeepliftshap": lambda m: camkit.LayerDeepLiftShap(m, "conv2", torch.linspace(-1, 1, 2 * 3 * 8 * 8).view(2, 3, 8, 8)),

    "deeplift": lambda m: camkit.DeepLift(m, baseline=0.1),
    "deepliftshap": lambda m: camkit.DeepLiftShap(m, torch.linspace(-1, 1, 3 * 3 * 8 * 8).view(3, 3, 8, 8)),
    "gradientshap": lambda m: camkit.GradientShap(
        m, torch.linspace(-1, 1, 2 * 3 * 8 * 8).view(2, 3, 8, 8), samples=6, stdev=0.1, seed=0, max_batch=5
    ),
    "lrp": lambda m: camkit.LRP(m, "epsilongammabox"),
    "attnlrp": lambda m: camkit.AttnLRP(m, rule="gamma"),
    "refinecam": lambda m: camkit.RefineCAM(m, ["conv1", "conv2"]),
    "segeigencam": lambda m: camkit.SegEigenCAM(m, "conv2"),
    "sscam": lambda m: camkit.SSCAM(m, "conv2", samples=2, std=0.5, seed=0, batch_size=7),
    "iscam": lambda m: camkit.ISCAM(m, "conv2", samples=2, batch_size=7),
}
FACTORIES.update({  # issue 29: these need a vision transformer; on TinyNet they refuse (no attention module)
    "attentionrollout": lambda m: camkit.AttentionRollout(m),
    "cheferrollout": lambda m: camkit.CheferRollout(m),
    "legrad": lambda m: camkit.LeGrad(m),
})

#: Methods the CNN-based generated tests skip, with why; their invariants run on tiny ViTs elsewhere.
NEEDS_VIT: dict[str, str] = {
    key: "reads a vision transformer's attention (TinyNet has none): tests/methods/test_vit_hygiene.py checks the "
    "same invariants on timm, torchvision and Hugging Face ViTs"
    for key in ("attentionrollout", "cheferrollout", "legrad")
}


def method_params(keys: list[str]) -> list:
    """``keys`` as pytest parameters, the ViT-only methods skipped with their reason."""
    return [pytest.param(k, marks=pytest.mark.skip(reason=NEEDS_VIT[k])) if k in NEEDS_VIT else k for k in keys]
