"""The explorer's model session: the model loaded once, its preprocessing, class names and a cache.

Plain Python, no web library: the tabs of :mod:`camkit.explorer.app` call :meth:`Session.explain`
and :meth:`Session.topk`, and so can a test or a notebook. A live explanation is exactly what the
Python API gives for the same input: ``Session.explain(image, "gradcam", target=c).map`` equals
``camkit.GradCAM(model)(x, c)[0]`` for ``x`` the preprocessed image.
"""

from __future__ import annotations

import json
import numbers
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import Tensor, nn

from .._internal.checks import check_logits
from .._internal.state import eval_mode
from ..errors import CamkitError, InvalidInputError, InvalidTargetError
from ..explanation import Explanation
from ..layers import list_layers
from ..methods import CAMExplainer, Explainer, GradientCAM
from ..modelload import LoadedModel, Preprocess, load_model
from ..registry import get_method, list_methods, takes_layer
from ..viz.overlay import overlay as blend
from .inputs import image_hash, method_settings, read_image

__all__ = ["LiveResult", "Session", "settings_key"]

_T = TypeVar("_T")
_NOT_LOGITS = (
    "the explorer explains classifiers returning logits [B, classes]; got {got} (detectors and segmenters: use "
    "camkit explain for now)"
)


def settings_key(settings: dict[str, Any]) -> str:
    """A method's settings as a stable text, for cache keys.

    Example:
        >>> settings_key({"b": 1, "a": [2]})
        '{"a": [2], "b": 1}'
    """
    return json.dumps(settings, sort_keys=True, default=repr)

@dataclass(frozen=True)
class LiveResult:
    """One live explanation.

    Attributes:
        overlay: uint8 [H, W, 3], the map over the input image at the image's own size (pixels a
            centre crop left out are shown without colour).
        map: float32 [h, w], exactly ``explanation.maps[0]`` at the model input's size.
        prediction: ``{"top": [{"index", "name", "score"}...], "target", "target_name", "layer",
            "method", "settings"}``; scores are softmax probabilities.
        explanation: the camkit :class:`~camkit.Explanation` (batch of one).
        image: the uint8 RGB image [H, W, 3] that was explained.
        shown: the uint8 RGB image [h, w, 3] the model saw (after resize and crop).
    """

    overlay: np.ndarray
    map: np.ndarray
    prediction: dict[str, Any]
    explanation: Explanation
    image: np.ndarray
    shown: np.ndarray


class _Recorder:
    """A callable target: scores ``target`` (or the predicted class) and keeps the logits of the first pass."""

    def __init__(self, target: int | None) -> None:
        self.target = target
        self.logits: Tensor | None = None

    def __call__(self, output: Tensor) -> Tensor:
        check_logits(output, _NOT_LOGITS)
        if self.logits is None:
            self.logits = output.detach()
        _check_target(self.target, output.shape[1])
        if self.target is None:
            return output.gather(1, output.argmax(dim=1, keepdim=True))[:, 0]
        return output[:, self.target]


def _check_target(target: int | None, classes: int) -> None:
    if target is not None and not 0 <= target < classes:
        raise InvalidTargetError(
            f"target class {target} is out of range: the model has {classes} classes (0 to {classes - 1}); "
            "pick one of the top classes or leave the target empty for the predicted class"
        )


class Session:
    """The model, its preprocessing and class names, loaded once, with a cache of explanations.

    Args:
        model: any form ``camkit explain --model`` takes (``"demo"``, ``"torchvision:resnet50"``,
            ``"timm:NAME"``, ``"hf:PATH"``, ``"package.module:factory"``, a saved model file), or an
            ``nn.Module``.
        preprocess: a :class:`camkit.modelload.Preprocess` to use instead of the model's own.
        class_names: class names by index (default: the model's own when it has them, else the
            index as text).
        weights, trust_pickle, size, crop, mean, std, device: as for :func:`camkit.load_model`.
        cache_size: explanations kept (least recently used dropped first).

    Example:
        >>> import numpy as np
        >>> from camkit.explorer import Session
        >>> session = Session("demo", device="cpu")
        >>> result = session.explain(np.zeros((64, 64, 3), np.uint8), "gradcam", target=1)
        >>> result.map.shape, result.overlay.shape, result.prediction["target_name"]
        ((64, 64), (64, 64, 3), 'square')
        >>> session.explain(np.zeros((64, 64, 3), np.uint8), "gradcam", target=1) is result
        True
    """

    def __init__(
        self,
        model: str | nn.Module | LoadedModel,
        preprocess: Preprocess | None = None,
        class_names: Sequence[str] | None = None,
        *,
        weights: str | None = None,
        trust_pickle: bool = False,
        size: int | Sequence[int] | None = None,
        crop: int | Sequence[int] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        device: str | torch.device | None = None,
        cache_size: int = 64,
    ) -> None:
        if isinstance(model, LoadedModel):
            loaded = model
        else:
            loaded = load_model(
                model, weights, trust_pickle=trust_pickle, size=size, crop=crop, mean=mean, std=std, device=device
            )
        if preprocess is not None and not isinstance(preprocess, Preprocess):
            raise InvalidInputError(
                f"preprocess must be a camkit.modelload.Preprocess (it is also used to put maps back on the "
                f"image); got {type(preprocess).__name__}. Build one with Preprocess(size=..., mean=..., std=...)"
            )
        self.loaded = loaded
        self.model: nn.Module = loaded.model
        self.preprocess: Preprocess = preprocess or loaded.preprocess
        self.device: torch.device = loaded.device
        names = class_names if class_names is not None else loaded.categories
        self.class_names: list[str] | None = list(names) if names is not None else None
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()  # LiveResults, media and detection results
        self._logits: OrderedDict[str, Tensor] = OrderedDict()
        self._explainers: dict[tuple[Any, ...], Explainer] = {}
        # One model run at a time: two explainers' hooks on the same modules at once would mix their captures.
        self._lock = threading.RLock()

    def clear_cache(self) -> None:
        """Forget the cached explanations and predictions (the explainers built so far are kept)."""
        with self._lock:
            self._cache.clear()
            self._logits.clear()

    def cached(self, key: tuple[Any, ...], compute: Callable[[], _T]) -> _T:
        """The result cached under ``key``, else ``compute()`` run while the model is held, then cached.

        One cache of ``cache_size`` results (least recently used dropped first) serves the
        explanations of images, media and detections; ``key`` must say everything the result
        depends on. ``compute`` runs under the session's lock: no other explanation runs meanwhile.
        """
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return cast(_T, self._cache[key])
            value = compute()
            self._cache[key] = value
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return value

    def forget(self, key: tuple[Any, ...]) -> None:
        """Drop the result cached under ``key`` (nothing if there is none)."""
        with self._lock:
            self._cache.pop(key, None)

    # What the page lists -------------------------------------------------------------------

    @staticmethod
    def methods() -> list[str]:
        """The registry keys, sorted (:func:`camkit.list_methods`)."""
        return list_methods()

    def layers(self) -> list[str]:
        """Dotted names of the model's modules, in definition order (the root left out)."""
        return [info.name for info in list_layers(self.model) if info.name]

    def auto_layer(self, image: Any, method: str = "gradcam") -> str | None:
        """The layer ``method`` picks by itself for ``image`` (``None`` for methods without a layer)."""
        if not takes_layer(method):
            return None
        x = self.input(read_image(image))[0]
        with self._lock:
            explainer = self._explainer(method, None, {})
            if not isinstance(explainer, CAMExplainer):
                return None
            return ", ".join(name for name, _ in explainer.layers(x))

    def name(self, index: int) -> str:
        """The class name of output ``index`` (its number as text without class names)."""
        if self.class_names is not None and 0 <= index < len(self.class_names):
            return self.class_names[index]
        return str(index)

    # Inputs and predictions ---------------------------------------------------------------

    def input(self, rgb: np.ndarray) -> tuple[Tensor, np.ndarray]:
        """``(x, shown)``: the model input [1, 3, h, w] on the session's device and the uint8 image it shows."""
        x, shown = self.preprocess(rgb)
        return x[None].to(self.device), shown

    def _predict(self, key: str, x: Tensor) -> Tensor:
        logits = self._logits.get(key)
        if logits is None:
            with torch.no_grad(), eval_mode(self.model):
                output = self.model(x)
            check_logits(output, _NOT_LOGITS)
            logits = self._remember_logits(key, output.detach())
        return logits

    def _remember_logits(self, key: str, logits: Tensor) -> Tensor:
        self._logits[key] = logits
        while len(self._logits) > self.cache_size:
            self._logits.popitem(last=False)
        return logits

    def _top(self, logits: Tensor, k: int) -> list[dict[str, Any]]:
        probs = logits.float().softmax(dim=1)[0]
        values, indices = probs.topk(min(k, probs.shape[0]))
        return [
            {"index": i, "name": self.name(i), "score": s}
            for i, s in zip(indices.cpu().tolist(), values.cpu().tolist())
        ]

    def topk(self, image: Any, k: int = 5) -> list[dict[str, Any]]:
        """The ``k`` most probable classes: ``[{"index", "name", "score"}...]``, best first (softmax scores).

        Example:
            >>> import numpy as np
            >>> from camkit.explorer import Session
            >>> top = Session("demo", device="cpu").topk(np.zeros((64, 64, 3), np.uint8), k=2)
            >>> len(top), sorted(top[0])
            (2, ['index', 'name', 'score'])
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInputError(f"k must be a positive int, got {k!r}")
        rgb = read_image(image)
        x, _ = self.input(rgb)
        with self._lock:
            return self._top(self._predict(image_hash(rgb), x), k)

    # Explaining ----------------------------------------------------------------------------

    def _explainer(self, method: str, layer: str | None, settings: dict[str, Any]) -> Explainer:
        key = (method, layer, settings_key(settings))
        found = self._explainers.get(key)
        if found is not None:
            return found
        cls = get_method(method)
        offered = method_settings(method)
        unknown = sorted(set(settings) - set(offered))
        if unknown:
            raise InvalidInputError(
                f"method {method!r} has no setting {', '.join(map(repr, unknown))}; its settings are "
                f"{sorted(offered) or 'none'}"
            )
        kwargs = dict(settings)
        if takes_layer(cls):
            kwargs["layer"] = layer
        elif layer is not None:
            raise InvalidInputError(f"method {method!r} works on the input pixels and takes no layer; leave it empty")
        try:
            explainer = cls(self.model, **kwargs)
        except CamkitError:
            raise
        except (TypeError, ValueError) as err:
            raise InvalidInputError(f"method {method!r} does not accept these settings {settings}: {err}") from None
        self._explainers[key] = explainer
        return explainer

    def explain(
        self, image: Any, method: str, layer: str | None = None, target: int | None = None, **settings: Any
    ) -> LiveResult:
        """Explain one image for ``target`` (default: the predicted class) with a registered method.

        Args:
            image: a file path, PIL image or uint8 array [H, W, 3].
            method: a registry key (:func:`camkit.list_methods`).
            layer: the dotted layer name; ``None`` for the method's automatic choice.
            target: the class index; ``None`` for the predicted class.
            **settings: the method's settings (:func:`camkit.explorer.inputs.method_settings`).

        Returns:
            A :class:`LiveResult`; the same object again for the same image, method, layer, target
            and settings.

        Raises:
            InvalidInputError: an unreadable image, an unknown setting, a method that does not fit the model.
            UnknownMethodError, LayerNotFoundError, InvalidTargetError: as the names say.
        """
        if target is not None:
            if isinstance(target, bool) or not isinstance(target, numbers.Integral):
                raise InvalidTargetError(f"target must be a class index (int) or None; got {target!r}")
            target = int(target)
        rgb = read_image(image)
        with self._lock:
            return self._explain(rgb, method, layer, target, settings)

    def _explain(
        self, rgb: np.ndarray, method: str, layer: str | None, target: int | None, settings: dict[str, Any]
    ) -> LiveResult:
        image_key = image_hash(rgb)
        key = (image_key, method, layer, target, settings_key(settings))

        def compute() -> LiveResult:
            explainer = self._explainer(method, layer, settings)
            x, shown = self.input(rgb)
            explanation, logits = self._run(explainer, image_key, x, target, method)
            return self._result(explanation, logits, rgb, shown, settings)

        return self.cached(key, compute)

    def _run(
        self, explainer: Explainer, image_key: str, x: Tensor, target: int | None, method: str
    ) -> tuple[Explanation, Tensor]:
        logits = self._logits.get(image_key)
        try:
            if logits is None and isinstance(explainer, GradientCAM):  # predictions from the explained pass itself
                recorder = _Recorder(target)
                explanation = explainer.explain(x, recorder)
                if recorder.logits is None:
                    raise InvalidInputError(f"method {method!r} never scored the model's output")
                logits = self._remember_logits(image_key, recorder.logits)
                chosen = int(logits.argmax(dim=1)[0]) if target is None else target
                explanation = replace(explanation, target=torch.tensor([chosen], device=explanation.maps.device))
            else:
                logits = self._predict(image_key, x) if logits is None else logits
                _check_target(target, logits.shape[1])
                chosen = int(logits.argmax(dim=1)[0]) if target is None else target
                explanation = explainer.explain(x, chosen)
        except CamkitError:
            raise
        except Exception as err:  # a method that does not fit this model: say so in one line
            text = str(err).strip().splitlines()
            raise InvalidInputError(
                f"method {method!r} does not fit this model: {type(err).__name__}: {text[0] if text else ''}; "
                "try another method or layer"
            ) from err
        return explanation, logits

    def _result(
        self, explanation: Explanation, logits: Tensor, rgb: np.ndarray, shown: np.ndarray, settings: dict[str, Any]
    ) -> LiveResult:
        heat = explanation.maps[0].detach().float()
        if heat.dim() != 2:
            raise InvalidInputError(f"the explorer shows image maps [H, W]; this explanation's map is {list(heat.shape)}")
        height, width = rgb.shape[:2]
        full, inside = self.preprocess.invert_map(heat.cpu(), height, width)
        drawn = np.where(inside.numpy()[:, :, None], blend(rgb, full), rgb)
        target = explanation.target
        chosen = int(target.reshape(-1)[0]) if target is not None else int(logits.argmax(dim=1)[0])
        prediction = {
            "top": self._top(logits, 5),
            "target": chosen,
            "target_name": self.name(chosen),
            "layer": ", ".join(explanation.layers) or None,
            "method": explanation.method,
            "settings": dict(settings),
        }
        return LiveResult(
            overlay=drawn.astype(np.uint8), map=heat.cpu().numpy().astype(np.float32, copy=False),
            prediction=prediction, explanation=explanation, image=rgb, shown=np.asarray(shown),
        )  # fmt: skip

    def render(self, result: LiveResult, alpha: float = 0.5, view: str = "map") -> np.ndarray:
        """Redraw a result: ``view="map"`` blends the map over the image at ``alpha``; ``"signed"`` shows a
        pixel attribution's signed values (blue negative, red positive) over the image the model saw.

        Example:
            >>> import numpy as np
            >>> from camkit.explorer import Session
            >>> session = Session("demo", device="cpu")
            >>> result = session.explain(np.zeros((64, 64, 3), np.uint8), "saliency")
            >>> session.render(result, 0.0).tolist() == result.image.tolist(), session.render(result, view="signed").shape
            (True, (64, 64, 3))
        """
        if not 0.0 <= alpha <= 1.0:
            raise InvalidInputError(f"alpha must be in [0, 1], got {alpha}")
        if view == "map":
            height, width = result.image.shape[:2]
            full, inside = self.preprocess.invert_map(torch.from_numpy(result.map), height, width)
            return np.where(inside.numpy()[:, :, None], blend(result.image, full, alpha=alpha), result.image)
        if view == "signed":
            from ..functional.views import attribution_view

            raw = result.explanation.raw
            if not isinstance(raw, Tensor) or raw.dim() != 4:
                raise InvalidInputError(
                    f"the signed view is for pixel attributions (saliency, integrated gradients...); "
                    f"{result.prediction['method']!r} gives a map in [0, 1]: use view='map'"
                )
            shown = torch.from_numpy(np.ascontiguousarray(result.shown)).permute(2, 0, 1)[None]
            picture = attribution_view(raw.detach().float().cpu(), shown, view="blended_heat_map", alpha=alpha)
            return picture[0].permute(1, 2, 0).numpy()
        raise InvalidInputError(f"view must be 'map' or 'signed', got {view!r}")
