"""``SESS`` and ``sliding_window``: pytorch-grad-cam's scale-space enhancement on :class:`camkit.SESS`."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor, nn

from ... import methods as _m
from ...methods.wrappers.sess import window_starts as _window_starts
from ._cams import GradCAM
from ._support import augmented, camkit_target, pop_legacy, to_numpy

__all__ = ["SESS", "sliding_window", "window_starts"]


def window_starts(length: int, step_size: int, window_size: int) -> list[int]:
    """Starts of windows of ``window_size`` every ``step_size`` along ``length``; the last one flush with the end.

    Example:
        >>> from camkit.compat.pytorch_grad_cam.sess import window_starts
        >>> window_starts(10, step_size=4, window_size=4)
        [0, 4, 6]
    """
    return _window_starts(length, step_size, window_size)


def sliding_window(height: int, width: int, step_size: int, window_size: int) -> list[tuple[int, int]]:
    """The ``(x, y)`` corners of the square windows that tile an image, rows outer, last windows shifted inside.

    Example:
        >>> from camkit.compat.pytorch_grad_cam.sess import sliding_window
        >>> sliding_window(288, 288, 224, 224)
        [(0, 0), (64, 0), (0, 64), (64, 64)]
    """
    return [
        (x, y)
        for y in window_starts(height, step_size, window_size)
        for x in window_starts(width, step_size, window_size)
    ]


class SESS:
    """SESS (Tang et al. 2022) around one of this package's CAM classes, computed by :class:`camkit.SESS`.

    The keywords are the original's (``scale_step_ratio``, ``window_size``, ``step_size``,
    ``pre_filter_ratio``, ``use_softmax_scores``, ``batch_size``); extra keywords go to ``base_method``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import SESS
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> with SESS(model=net, target_layers=[net[1]], num_scales=2) as cam:
        ...     cam(input_tensor=torch.rand(1, 3, 8, 8)).shape
        (1, 8, 8)
    """

    def __init__(
        self,
        model: nn.Module,
        target_layers: Any = None,
        reshape_transform: Any = None,
        base_method: type = GradCAM,
        scales: list[int] | None = None,
        num_scales: int = 12,
        scale_step_ratio: float = 2.0 / 7.0,
        window_size: int | None = None,
        step_size: int | None = None,
        pre_filter_ratio: float = 0.0,
        theta: float = 0.0,
        pool: str = "mean",
        smooth: bool = True,
        use_softmax_scores: bool = True,
        batch_size: int = 32,
        **kwargs: Any,
    ) -> None:
        self.base_cam = base_method(model, target_layers, reshape_transform, **kwargs)
        self.model = self.base_cam.model
        self.device = self.base_cam.device
        self.scales = scales
        self.num_scales = num_scales
        self.scale_step_ratio = scale_step_ratio
        self.window_size = window_size
        self.step_size = step_size
        self.pre_filter_ratio = pre_filter_ratio
        self.theta = theta
        self.pool = pool
        self.smooth = smooth
        self.use_softmax_scores = use_softmax_scores
        self.batch_size = batch_size
        self._sess(False)  # the argument checks, now rather than at the first call

    def _sess(self, eigen_smooth: bool) -> _m.SESS:
        return _m.SESS(
            self.base_cam._build(eigen_smooth),
            scales=self.scales,
            num_scales=self.num_scales,
            scale_step=self.scale_step_ratio,
            window=self.window_size,
            stride=self.step_size,
            pre_filter=self.pre_filter_ratio,
            theta=self.theta,
            pool=self.pool,  # type: ignore[arg-type]
            smooth=self.smooth,
            softmax=self.use_softmax_scores,
            max_batch=self.batch_size,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.forward(*args, **kwargs)

    def forward(
        self,
        input_tensor: Tensor,
        targets: Any = None,
        eigen_smooth: bool = False,
        aug_smooth: bool = False,
        **legacy: Any,
    ) -> np.ndarray:
        """Maps float32 [B, H, W] in [0, 1]; one target per image, or ``None`` for each image's top class."""
        pop_legacy(legacy, "SESS")
        sess = self._sess(eigen_smooth)

        def run(x: Tensor) -> np.ndarray:
            x = x.detach().to(self.device)
            return to_numpy(sess(x, camkit_target(targets, x.shape[0])))

        return augmented(run, input_tensor, self.base_cam.tta_transforms) if aug_smooth else run(input_tensor)

    def __enter__(self) -> SESS:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
