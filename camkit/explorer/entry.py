"""``camkit.app``: the explorer from Python (Gradio is imported only when it is called)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import CamkitError

if TYPE_CHECKING:
    from ..modelload import Preprocess
    from .app import ExplorerBlocks

__all__ = ["INSTALL_HINT", "GradioMissingError", "app", "require_gradio"]

INSTALL_HINT = 'the explorer needs Gradio: pip install "camkit[app]"'


class GradioMissingError(CamkitError, ImportError):
    """Gradio (the ``camkit[app]`` extra) is not installed."""


def require_gradio() -> None:
    """Raise :class:`GradioMissingError` with the install line when Gradio cannot be imported."""
    try:
        import gradio  # noqa: F401
    except ImportError as err:
        raise GradioMissingError(f"{INSTALL_HINT} ({err})") from None


def app(
    model: str | nn.Module,
    preprocess: Preprocess | None = None,
    class_names: Sequence[str] | None = None,
    audits: Sequence[str | os.PathLike[str]] = (),
    evaluations: Sequence[str | os.PathLike[str]] = (),
    *,
    weights: str | None = None,
    trust_pickle: bool = False,
    device: str | torch.device | None = None,
    **load: Any,
) -> ExplorerBlocks:
    """The explorer web app on a model: explain, compare, browse audits and evaluations live.

    Returns the Gradio ``Blocks``; ``.launch()`` serves it on 127.0.0.1 (no share link, no analytics,
    nothing fetched from outside the machine) and shows it inline in Jupyter. The model loads once;
    explanations are cached. Needs the ``camkit[app]`` extra (Gradio).

    Args:
        model: an ``nn.Module``, or any form ``camkit explain --model`` takes (``"demo"``,
            ``"torchvision:resnet50"``, ``"timm:NAME"``, ``"hf:PATH"``, ``"package.module:factory"``...). A
            vision-language model's ``"hf:FOLDER"`` gets the Explain tab with a prompt.
        preprocess: a :class:`camkit.modelload.Preprocess` (default: the model's own, else 224x224
            with ImageNet statistics).
        class_names: names by class index (default: the model's own when it has them).
        audits: ``camkit audit`` output folders to browse in the "Audit" tab.
        evaluations: ``camkit evaluate`` output folders for the "Evaluate" tab.
        weights, trust_pickle, device: as for :func:`camkit.load_model`; ``**load`` passes ``size``,
            ``crop``, ``mean`` and ``std`` on to it.

    Raises:
        GradioMissingError: Gradio is not installed (an ``ImportError``).

    Example:
        >>> import camkit
        >>> demo = camkit.app(model="demo", device="cpu")
        >>> type(demo).__name__
        'ExplorerBlocks'
        >>> demo.launch()  # serves http://127.0.0.1:7860  # doctest: +SKIP
    """
    require_gradio()
    from ..modelload.hf import is_generation_model
    from .app import build_app
    from .session import Session

    if isinstance(model, str) and model.startswith("hf:") and is_generation_model(model[len("hf:") :]):
        from .generation import GenerationSession

        return build_app(GenerationSession(model, device=device))

    session = Session(model, preprocess, class_names, weights=weights, trust_pickle=trust_pickle, device=device, **load)
    return build_app(session, audits, evaluations)
