"""captum 0.9.0's ``captum.attr`` computed by camkit: the gradient, layer and perturbation methods.

Each class keeps captum's constructor and ``attribute`` signature and returns captum's shapes and
dtypes; the attribution is computed by camkit's explainer of the same method (see each class).
Methods camkit does not compute are present by name and raise
:class:`~camkit.compat.captum.attr.NotComputedError` when built.
"""

from ._base import (
    Attribution,
    GradientAttribution,
    InternalAttribution,
    LayerAttribution,
    NeuronAttribution,
    NotComputedError,
    PerturbationAttribution,
)
from ._deeplift_layer import LayerDeepLift, LayerDeepLiftShap
from ._embedding import (
    InterpretableEmbeddingBase,
    configure_interpretable_embedding_layer,
    remove_interpretable_embedding_layer,
)
from ._gradient import (
    Deconvolution,
    DeepLift,
    DeepLiftShap,
    GuidedBackprop,
    InputXGradient,
    IntegratedGradients,
    Saliency,
)
from ._influence import InternalInfluence, LayerGradientShap, NeuronConductance
from ._layer import (
    GuidedGradCam,
    LayerActivation,
    LayerConductance,
    LayerGradCam,
    LayerGradientXActivation,
    LayerIntegratedGradients,
)
from ._layer_ablation import LayerFeatureAblation, NeuronFeatureAblation
from ._layer_lrp import LayerLRP
from ._lrp import LRP, Alpha1_Beta0_Rule, EpsilonRule, GammaRule, IdentityRule, PropagationRule
from ._missing import MISSING, missing_class
from ._neuron import NeuronDeconvolution, NeuronGradient, NeuronGuidedBackprop, NeuronIntegratedGradients
from ._neuron_shap import NeuronDeepLift, NeuronDeepLiftShap, NeuronGradientShap
from ._noise import SUPPORTED_NOISE_TUNNEL_TYPES, NoiseTunnel
from ._perturbation import (
    FeatureAblation,
    FeaturePermutation,
    KernelShap,
    LayerFeaturePermutation,
    Lime,
    LimeBase,
    Occlusion,
    ShapleyValues,
    ShapleyValueSampling,
)
from ._shap import GradientShap
from ._wrapper import InputIdentity, ModelInputWrapper

__all__ = [
    "LRP",
    "MISSING",
    "SUPPORTED_NOISE_TUNNEL_TYPES",
    "Alpha1_Beta0_Rule",
    "Attribution",
    "Deconvolution",
    "DeepLift",
    "DeepLiftShap",
    "EpsilonRule",
    "FeatureAblation",
    "FeaturePermutation",
    "GammaRule",
    "GradientAttribution",
    "GradientShap",
    "GuidedBackprop",
    "GuidedGradCam",
    "IdentityRule",
    "InputIdentity",
    "InputXGradient",
    "IntegratedGradients",
    "InternalAttribution",
    "InternalInfluence",
    "InterpretableEmbeddingBase",
    "KernelShap",
    "LayerActivation",
    "LayerAttribution",
    "LayerConductance",
    "LayerDeepLift",
    "LayerDeepLiftShap",
    "LayerFeatureAblation",
    "LayerFeaturePermutation",
    "LayerGradCam",
    "LayerGradientShap",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
    "LayerLRP",
    "Lime",
    "LimeBase",
    "ModelInputWrapper",
    "NeuronAttribution",
    "NeuronConductance",
    "NeuronDeconvolution",
    "NeuronDeepLift",
    "NeuronDeepLiftShap",
    "NeuronFeatureAblation",
    "NeuronGradient",
    "NeuronGradientShap",
    "NeuronGuidedBackprop",
    "NeuronIntegratedGradients",
    "NoiseTunnel",
    "NotComputedError",
    "Occlusion",
    "PerturbationAttribution",
    "PropagationRule",
    "Saliency",
    "ShapleyValueSampling",
    "ShapleyValues",
    "configure_interpretable_embedding_layer",
    "missing_class",
    "remove_interpretable_embedding_layer",
]


def __getattr__(name: str) -> type:
    if name in MISSING:
        return missing_class(name)
    raise AttributeError(f"module 'captum.attr' (camkit.compat.captum.attr) has no attribute {name!r}")
