"""pytorch-grad-cam's projections of activations on their first (kernel) principal component, on camkit's.

numpy [B, C, *s] in, float32 numpy [B, *s] out; NaNs count as zeros and the input is never
modified. The component's sign is camkit's (the projection correlates positively with the
channel-summed activations), where the original keeps whatever sign its SVD returns.
"""

from __future__ import annotations

import numpy as np
import torch

from ....functional.cam_extra import kpca_projection
from ....functional.perturbation import eigen_projection
from .._pgc_numpy import as_tensor

__all__ = ["get_2d_projection", "get_2d_projection_kernel", "get_2d_projection_with_sign_correction"]


def get_2d_projection(activation_batch: np.ndarray) -> np.ndarray:
    """Each sample's centred activations projected on their first principal direction.

    Example:
        >>> import numpy as np
        >>> from camkit.compat.pytorch_grad_cam.utils.svd_on_activations import get_2d_projection
        >>> a = np.array([[[[0.0, 1.0, 2.0]], [[0.0, 2.0, 4.0]]]], dtype=np.float32)
        >>> [round(float(v), 4) for v in get_2d_projection(a).ravel()]
        [-2.2361, 0.0, 2.2361]
    """
    return eigen_projection(as_tensor(activation_batch)).numpy().astype(np.float32)


def get_2d_projection_kernel(
    activation_batch: np.ndarray, kernel: str = "sigmoid", gamma: float | None = None
) -> np.ndarray:
    """The projection on the first kernel principal component (``kernel`` as scikit-learn names them)."""
    return kpca_projection(as_tensor(activation_batch), kernel, gamma, 3, 1.0).numpy().astype(np.float32)  # type: ignore[arg-type]


def get_2d_projection_with_sign_correction(activation_batch: np.ndarray) -> np.ndarray:
    """:func:`get_2d_projection`, each map negated where its most negative value outweighs its largest."""
    maps = torch.from_numpy(get_2d_projection(activation_batch))
    flat = maps.flatten(1)
    flip = flat.amin(dim=1).abs() > flat.amax(dim=1).abs()
    return torch.where(flip.view(-1, *(1,) * (maps.dim() - 1)), -maps, maps).numpy()
