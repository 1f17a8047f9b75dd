"""captum's ``captum.attr.visualization``: attribution pictures drawn by camkit.viz.

``visualize_image_attr`` draws an attribution [H, W, C] (numpy, as captum takes it) over an image with
camkit's overlay; captum's other figure layouts (``visualize_image_attr_multiple`` with its
``alpha_scaling`` and ``masked_image`` methods, the timeseries and text views) are refused with a
clear error rather than drawn differently.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._base import NotComputedError

__all__ = [
    "normalize_attr",
    "visualize_image_attr",
    "visualize_image_attr_multiple",
    "visualize_text",
    "visualize_timeseries_attr",
]

_SIGNS = ("all", "positive", "negative", "absolute_value")


def normalize_attr(attr: np.ndarray, sign: str, outlier_perc: float = 2, reduction_axis: int | None = None) -> np.ndarray:
    """Attributions [H, W(, C)] scaled to [-1, 1] (``"all"``) or [0, 1], clipped at the ``100 - outlier_perc`` percentile.

    Example:
        >>> import numpy as np
        >>> from camkit.compat.captum.attr.visualization import normalize_attr
        >>> normalize_attr(np.array([[1.0, -2.0], [4.0, 0.0]]), "absolute_value", outlier_perc=0).tolist()
        [[0.25, 0.5], [1.0, 0.0]]
    """
    if sign not in _SIGNS:
        raise ValueError(f"sign must be one of {_SIGNS}, got {sign!r}")
    values = attr.sum(axis=reduction_axis) if reduction_axis is not None else attr
    if sign == "positive":
        values = np.clip(values, 0, None)
    elif sign == "negative":
        values = np.clip(values, None, 0)
    elif sign == "absolute_value":
        values = np.abs(values)
    top = np.percentile(np.abs(values).ravel(), 100 - outlier_perc)
    if abs(top) < 1e-5:
        return np.clip(values, -1, 1)
    return np.clip(values / top, -1, 1)


def visualize_image_attr(attr: np.ndarray, original_image: np.ndarray | None = None, method: str = "heat_map",
                         sign: str = "absolute_value", plt_fig_axis: Any = None, outlier_perc: float = 2,
                         cmap: Any = None, alpha_overlay: float = 0.5, show_colorbar: bool = False,
                         title: str | None = None, fig_size: tuple[int, int] = (6, 6), use_pyplot: bool = True) -> Any:
    """captum's ``visualize_image_attr`` for ``method`` ``"heat_map"``, ``"blended_heat_map"`` and ``"original_image"``.

    Returns ``(figure, axis)`` as captum does.
    """
    import matplotlib.pyplot as plt

    if method not in ("heat_map", "blended_heat_map", "original_image"):
        raise NotComputedError(f"visualize_image_attr(method={method!r}): camkit draws heat maps and blends only")
    if plt_fig_axis is None:
        figure, axis = plt.subplots(figsize=fig_size)
    else:
        figure, axis = plt_fig_axis
    axis.axis("off")
    if method == "original_image" or method == "blended_heat_map":
        if original_image is None:
            raise ValueError(f"method {method!r} needs original_image")
        axis.imshow(np.squeeze(original_image))
    if method != "original_image":
        values = normalize_attr(attr, sign, outlier_perc, reduction_axis=2 if attr.ndim == 3 else None)
        low = -1 if sign == "all" else 0
        shown = axis.imshow(values, cmap=cmap or ("bwr" if sign == "all" else "Greens"), vmin=low, vmax=1,
                            alpha=alpha_overlay if method == "blended_heat_map" else 1.0)
        if show_colorbar:
            figure.colorbar(shown, ax=axis)
    if title:
        axis.set_title(title)
    if use_pyplot and plt_fig_axis is None:
        plt.close(figure)
    return figure, axis


def visualize_image_attr_multiple(*args: Any, **kwargs: Any) -> Any:
    raise NotComputedError("visualize_image_attr_multiple: not drawn by camkit; call visualize_image_attr per method")


def visualize_timeseries_attr(*args: Any, **kwargs: Any) -> Any:
    raise NotComputedError("visualize_timeseries_attr: not drawn by camkit (camkit.viz draws signals)")


def visualize_text(*args: Any, **kwargs: Any) -> Any:
    raise NotComputedError("visualize_text: camkit has no text tools")
