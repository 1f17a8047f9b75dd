"""What :func:`camkit.explain_generation` returns: the answer's tokens and a map on the image for each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..explanation import Explanation

if TYPE_CHECKING:
    from ..viz.canvas import ExplanationFigure

__all__ = ["GenerationExplanation"]


@dataclass(frozen=True)
class GenerationExplanation:
    """The tokens a vision-language model wrote for each prompt, and where in the image each came from.

    Lists run over the prompts (``b``); an answer has ``T_b`` tokens and its image its own size.

    Attributes:
        tokens: the decoded text of each token, per prompt.
        token_ids: LongTensor [T_b] per prompt.
        maps: float32 [T_b, H_b, W_b] per prompt in [0, 1], at the image's original size (each map
            min-max normalised; a flat map is all zeros).
        scores: float32 [T_b] per prompt, the log-probability of each token given the image, the
            prompt and the answer before it.
        explanations: the per-prompt :class:`camkit.Explanation` (``raw``: the unnormalised maps
            [T_b, H_b, W_b]; ``extras["unit_scores"]``: the method's scores per image unit).
        method: the method's key.

    Example:
        >>> import torch
        >>> from camkit.vlm.result import GenerationExplanation
        >>> r = GenerationExplanation([["a", "cat"]], [torch.tensor([5, 20])], [torch.zeros(2, 4, 6)],
        ...                           [torch.zeros(2)], [], "gradcam")
        >>> r.maps_tensor().shape, r.text(0)
        (torch.Size([1, 2, 4, 6]), 'a cat')
    """

    tokens: list[list[str]]
    token_ids: list[Tensor]
    maps: list[Tensor]
    scores: list[Tensor]
    explanations: list[Explanation]
    method: str
    _again: Callable[[int, int], GenerationExplanation] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        counts = [len(t) for t in self.tokens]
        sizes = [tuple(m.shape[1:]) for m in self.maps]
        return f"GenerationExplanation(method={self.method!r}, prompts={len(self)}, tokens={counts}, sizes={sizes})"

    def text(self, index: int = 0) -> str:
        """The answer to prompt ``index`` as its tokens joined by spaces (a readable label, not a detokenisation)."""
        return " ".join(t.strip() for t in self.tokens[index])

    def maps_tensor(self) -> Tensor:
        """The maps as one tensor [B, T, H, W]; raises when answer lengths or image sizes differ."""
        shapes = {tuple(m.shape) for m in self.maps}
        if len(shapes) != 1:
            raise InvalidInputError(
                f"the maps have different shapes {sorted(shapes)} (answers of other lengths or images of other sizes); "
                "read them one by one from .maps"
            )
        return torch.stack(self.maps)

    def span(self, start: int, end: int) -> GenerationExplanation:
        """The phrase of tokens ``start`` to ``end`` (exclusive) of each answer as one target, explained again.

        The phrase's score is the sum of its tokens' log-probabilities; the same method and options
        make one map per prompt. The result holds one entry per prompt: ``tokens[b] == [phrase]``,
        ``token_ids[b]`` the phrase's ids [K], ``maps[b]`` [1, H_b, W_b], ``scores[b]`` [1]; so
        ``span(s, e).maps_tensor()[:, 0]`` is [B, H, W] when the images share a size.
        """
        if self._again is None:
            raise InvalidInputError("this result was not made by explain_generation, which keeps what span needs")
        if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int) or not isinstance(end, int):
            raise InvalidInputError(f"span takes token indices (ints), got {start!r} and {end!r}")
        shortest = min(len(t) for t in self.tokens)
        if not 0 <= start < end <= shortest:
            raise InvalidInputError(
                f"span({start}, {end}) is not a phrase of every answer: give 0 <= start < end <= {shortest} "
                "(the shortest answer's length)"
            )
        return self._again(start, end)

    def show(self, image: Any, index: int = 0, **options: Any) -> ExplanationFigure:
        """Draw answer ``index`` as a strip: one overlay per token on ``image``, the token beneath (needs matplotlib).

        ``image`` is the image explained for that prompt (uint8 [H, W, 3], PIL, or a float tensor
        [3, H, W] in [0, 1]); ``options`` go to :func:`camkit.viz.tokens.token_strip` (``columns``,
        ``alpha``, ``colormap``, ``panel``, ``dpi``). In Jupyter the figure displays itself; ``.save(path)``
        writes a PNG.

        Example:
            >>> import torch
            >>> from camkit.vlm.result import GenerationExplanation
            >>> r = GenerationExplanation([["a", "cat"]], [torch.tensor([5, 20])], [torch.zeros(2, 4, 6)],
            ...                           [torch.zeros(2)], [], "gradcam")
            >>> r.show(torch.zeros(3, 4, 6), dpi=30).columns
            ('token 0', 'token 1')
        """
        from ..viz.tokens import token_strip  # pictures load when one is drawn: the result is plain data

        return token_strip(image, self, index=index, **options)
