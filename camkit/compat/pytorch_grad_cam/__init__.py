"""pytorch-grad-cam 1.5.7's API computed by camkit: switch an existing script with one line.

    import camkit.compat.pytorch_grad_cam as pgc
    pgc.install()                   # before the script's first 'import pytorch_grad_cam'
    from pytorch_grad_cam import GradCAM   # now camkit's translation

Or import the classes from here directly. The module paths and names are the original's
(``pytorch_grad_cam.utils.model_targets.ClassifierOutputTarget``...); every CAM runs on camkit's
explainer of the same method, and pytorch-grad-cam's map dressing (per-layer min-max, resize,
mean over layers) is applied to camkit's raw maps. The differences from the original are listed
in the migration guide (docs/migration/pytorch-grad-cam.md).
"""

from . import (
    ablation_cam,
    eigen_cam,
    eigen_grad_cam,
    fem,
    fullgrad_cam,
    grad_cam,
    grad_cam_elementwise,
    grad_cam_plusplus,
    hirescam,
    kpca_cam,
    layer_cam,
    metrics,
    random_cam,
    score_cam,
    seg_eigen_cam,
    shapley_cam,
    utils,
    xgrad_cam,
)
from ._cams import (
    FEM,
    KPCA_CAM,
    AblationCAM,
    EigenCAM,
    EigenGradCAM,
    FullGrad,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    RandomCAM,
    ScoreCAM,
    SegEigenCAM,
    ShapleyCAM,
    XGradCAM,
)
from ._install import AlreadyImportedError, install, installed, uninstall
from .ablation_layer import AblationLayer, AblationLayerFasterRCNN, AblationLayerVit
from .activations_and_gradients import ActivationsAndGradients
from .base_cam import BaseCAM
from .feature_factorization.deep_feature_factorization import DeepFeatureFactorization, run_dff_on_image
from .finer_cam import FinerCAM
from .guided_backprop import GuidedBackpropReLUModel
from .metrics import arcc, cam_mult_image, road
from .refine_cam import RefineCAM
from .sess import SESS
from .utils import model_targets, reshape_transforms
from .utils.image import deprocess_image
from .utils.svd_on_activations import get_2d_projection

__all__ = [
    "FEM",
    "KPCA_CAM",
    "SESS",
    "AblationCAM",
    "AblationLayer",
    "AblationLayerFasterRCNN",
    "AblationLayerVit",
    "ActivationsAndGradients",
    "AlreadyImportedError",
    "BaseCAM",
    "DeepFeatureFactorization",
    "EigenCAM",
    "EigenGradCAM",
    "FinerCAM",
    "FullGrad",
    "GradCAM",
    "GradCAMElementWise",
    "GradCAMPlusPlus",
    "GuidedBackpropReLUModel",
    "HiResCAM",
    "LayerCAM",
    "RandomCAM",
    "RefineCAM",
    "ScoreCAM",
    "SegEigenCAM",
    "ShapleyCAM",
    "XGradCAM",
    "ablation_cam",
    "arcc",
    "cam_mult_image",
    "deprocess_image",
    "eigen_cam",
    "eigen_grad_cam",
    "fem",
    "fullgrad_cam",
    "get_2d_projection",
    "grad_cam",
    "grad_cam_elementwise",
    "grad_cam_plusplus",
    "hirescam",
    "install",
    "installed",
    "kpca_cam",
    "layer_cam",
    "metrics",
    "model_targets",
    "random_cam",
    "reshape_transforms",
    "road",
    "run_dff_on_image",
    "score_cam",
    "seg_eigen_cam",
    "shapley_cam",
    "uninstall",
    "utils",
    "xgrad_cam",
]
