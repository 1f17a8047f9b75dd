"""What the attention methods share: :class:`AttentionExplainer` and the helpers its subclasses use.

Each method reads the model's attention probabilities ``A_l`` [B, heads, N, N] during one forward
(:class:`camkit.methods.attention.capture.AttentionCapture`: timm, torchvision and Hugging Face ViTs,
fused attention switched off for the call only) and turns them into relevance over the patch
tokens; the math is in :mod:`camkit.functional.attention`. Prefix tokens (class, distillation,
register tokens) are dropped from the keys; their count comes from the model
(:func:`camkit.layers.layout.prefix_token_hint`). The map is the patch grid, upsampled
bilinearly (``align_corners=False``) to the input and min-max normalised; a constant map is
flagged ``flat``, as for every camkit method.

Models that read a class token use its row of the relevance matrix; models that pool their
tokens (timm's ``global_pool="avg"``, a model without class token) use the mean of all rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..._internal.checks import check_input_batch
from ..._internal.state import eval_mode
from ...errors import InvalidInputError, LayerNotReachedError
from ...explanation import Explanation
from ...functional.tokens import infer_token_grid
from ...layers.layout import prefix_token_hint
from ...targets.classes import OutputSelector, Target
from ...targets.tokens import TokenTarget
from .._core.binding import InputIndex
from .._core.explainer import Explainer
from .._core.output import make_explanation
from .blockwise import BlockRecorder, attention_blocks
from .budget import GraphShape, PathChoice, choose_path, graph_shape, memory_option, path_option, whole_graph_bytes
from .capture import AttentionCapture, attention_modules

__all__ = ["AttentionExplainer", "frozen_parameters", "known_head"]

Head = Callable[[Tensor], Any]


def _reads_class_token(model: nn.Module, prefix: int) -> bool:
    pool = getattr(model, "global_pool", None)
    if isinstance(pool, str) and type(model).__module__.startswith("timm"):
        return pool == "token" and prefix > 0
    return prefix > 0


class AttentionExplainer(Explainer):
    """Base of the attention methods: the model's attention layers, its token layout, the output contract.

    Args:
        model: a vision transformer (timm, torchvision or Hugging Face ViT, DeiT, DINOv2, CLIP vision).
        query: which query row is read: ``"auto"`` (the class token's row when the model reads its
            class token, else the mean of all rows), ``"class"`` or ``"mean"``.
        output, keep_mode, input_index: see :class:`camkit.Explainer`.

    Raises:
        InvalidInputError: for a model without attention camkit can read: windowed attention (Swin),
            or an attention class it does not know (named in the message).

    Example:
        >>> import torch
        >>> from torchvision.models import VisionTransformer
        >>> import camkit
        >>> vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16)
        >>> camkit.AttentionRollout(vit).layer_names()
        ['encoder.layers.encoder_layer_0.self_attention', 'encoder.layers.encoder_layer_1.self_attention']
    """

    family: ClassVar[str | None] = "attention"
    # the gradient methods' path (camkit.methods.attention.budget): "auto", "whole" or "blockwise"
    path: str = "auto"
    max_memory: int | None = None
    # what the whole graph's memory is estimated from (read by _set_path); None: no estimate, block by block
    _shape: GraphShape | None = None
    # samples per block call in that path (camkit.methods.attention.blockwise.micro_batches); None: about a quarter of the batch
    _block_batch: int | None = None
    # blocks per segment of CheferRollout's backward (camkit.methods.attention.blockwise.segment_length); None: ceil(sqrt(L))
    _segment: int | None = None

    def __init__(
        self,
        model: nn.Module,
        *,
        query: str = "auto",
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        if query not in ("auto", "class", "mean"):
            raise InvalidInputError(f"query must be 'auto', 'class' or 'mean', got {query!r}")
        self.query = query
        self._modules = attention_modules(self.model)
        hint = prefix_token_hint(self.model)
        self._prefix = hint if isinstance(hint, int) else None

    def explain(
        self,
        x: Tensor,
        target: Target = None,
        *,
        inputs: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Explanation:
        """Explain a batch; see :meth:`camkit.Explainer.explain`.

        A :class:`~camkit.TokenTarget` on a vision-language model camkit knows (LLaVA, PaliGemma,
        Gemma 3...; ``x`` its ``pixel_values``, the sequence as ``kwargs={"input_ids": ids}``) is
        explained by the method's own definition over the *language model's* layers, from the row
        that predicts the token to the image tokens, laid on ``x``'s patch grid (see
        :mod:`camkit.vlm.explainers`): the vision tower's attention, which the method reads on an
        image model, does not lead from a written token back to the image.
        """
        if isinstance(target, TokenTarget):
            return self._explain_tokens(x, target, inputs, kwargs)
        return super().explain(x, target, inputs=inputs, kwargs=kwargs)

    def _token_options(self) -> dict[str, Any]:
        """The options the language model's path takes from this explainer (refusing those it cannot honour)."""
        return {}

    def _explain_tokens(
        self, x: Tensor, target: TokenTarget, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
    ) -> Explanation:
        """A :class:`~camkit.TokenTarget`: the method over the language model's layers (:mod:`camkit.vlm.explainers`)."""
        from ...vlm.explainers import check_model, token_attention_maps  # the vision-language wing, loaded here

        check_model(self.model, type(self).__name__)
        check_input_batch(x)
        call = self._bind_inputs(x, inputs, kwargs)
        if call is None or not isinstance(call.slot, str) or call.args:
            raise InvalidInputError(
                f"{type(self).__name__} explains a TokenTarget on a vision-language model called by keyword: build it "
                "with input_index='pixel_values' and pass kwargs={'input_ids': ids} (no positional inputs)"
            )
        options = self._token_options()
        x = self._match_dtype(x)
        with eval_mode(self.model, enabled=not self.keep_mode):
            raw, scores, extras = token_attention_maps(self.key, self.model, {**call.kwargs, call.slot: x}, x, target, options)
        return make_explanation(self.key, [raw], x, None, scores, **extras)

    def layer_names(self) -> list[str]:
        """The attention modules read, in the order the model registers them."""
        return [name for name, _, _ in self._modules]

    def _layout(self, tokens: int, x: Tensor) -> tuple[int, tuple[int, ...], str]:
        prefix, *grid = infer_token_grid(tokens, tuple(int(s) for s in x.shape[2:]), prefix=self._prefix)
        query = self.query
        if query == "auto":
            query = "class" if _reads_class_token(self.model, prefix) else "mean"
        return prefix, tuple(grid), query

    def _finish(self, rows: list[Tensor], x: Tensor, grid: tuple[int, ...], classes: Tensor | None, scores: Tensor) -> Explanation:
        maps = [row.reshape(row.shape[0], *grid) for row in rows]
        raw = torch.stack(maps, dim=1) if scores.dim() == 2 else maps[0]
        return make_explanation(self.key, [raw], x, classes, scores.detach(), tuple(self.layer_names()))

    def _set_path(self, path: str, max_memory: int | None) -> None:
        """Check and keep ``path=`` and ``max_memory=`` (see :mod:`camkit.methods.attention.budget`), and read the
        shapes the whole graph's memory is estimated from."""
        self.path = path_option(path)
        self.max_memory = memory_option(max_memory)
        modules = [module for _, module, _ in self._modules]
        self._shape = graph_shape(self.model, modules, attention_blocks(self.model, self.layer_names()), self._prefix)

    def _choose(self, x: Tensor) -> PathChoice:
        """The path this call takes by ``path=`` and the memory budget, from shapes alone (no host sync)."""
        shape = self._shape
        estimate = None if shape is None else whole_graph_bytes(shape, x.shape[0], tuple(x.shape[2:]))
        return choose_path(self.path, estimate, self.max_memory, x.device)

    @staticmethod
    def _reported(explanation: Explanation, choice: PathChoice, taken: str) -> Explanation:
        """``explanation`` with the path ``taken`` and the memory figures in its ``extras``."""
        return dataclasses.replace(explanation, extras={**explanation.extras, **choice.extras(taken)})

    def _replays(self, target: Target, choice: PathChoice) -> list[nn.Module] | None:
        """The blocks to call again one at a time, or ``None`` for the whole-graph path.

        Not when the choice is the whole graph, when a module is in training mode (dropout would
        draw new masks), nor for a target that reads a hidden layer (its score is on no graph in a
        forward without one).
        """
        if choice.path == "whole" or callable(getattr(target, "bind_model", None)):
            return None
        if any(m.training for m in self.model.modules()):
            return None
        return attention_blocks(self.model, self.layer_names())

    def _recorded_forward(
        self, capture: AttentionCapture, recorder: BlockRecorder, x: Tensor, target: Target
    ) -> tuple[Tensor | None, Tensor] | None:
        """The forward that only records the block calls (the model's own attention): ``(classes, scores)``,
        with ``capture`` recording again after it; ``None`` when the blocks cannot be called again."""
        capture.live = False
        classes, scores = self._target_scores(x, target)
        if not recorder.replayable(chain=True):
            return None
        recorder.stop()
        capture.live = True
        return classes, scores

    @staticmethod
    def _columns(scores: Tensor) -> tuple[Tensor, ...]:
        return scores.unbind(dim=1) if scores.dim() == 2 else (scores,)

    @staticmethod
    def _grads_of(grad: Tensor | None, attention: Tensor, name: str) -> Tensor:
        if grad is None:
            raise LayerNotReachedError(f"the score does not depend on the attention of '{name}'")
        return grad if grad.shape == attention.shape else grad.expand_as(attention)

    @staticmethod
    def _grads(score: Tensor, attentions: list[Tensor], names: list[str], retain: bool) -> list[Tensor]:
        if not score.requires_grad:
            raise LayerNotReachedError("the score does not depend on the model's attention: no graph links them")
        grads = torch.autograd.grad(score.sum(), attentions, retain_graph=retain, allow_unused=True)
        out = []
        for name, attention, grad in zip(names, attentions, grads):
            if grad is None:
                raise LayerNotReachedError(f"the score does not depend on the attention of '{name}'")
            out.append(grad if grad.shape == attention.shape else grad.expand_as(attention))
        return out


@contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """The model's parameters that require grad set not to for the block, put back after (also after an error).

    No parameter gradient is taken then: autograd keeps only what the attention's gradient needs.
    """
    frozen = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(False)
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _mean_head(norm: Callable[[Tensor], Tensor], head: Callable[[Tensor], Any]) -> Head:
    return lambda tokens: head(norm(tokens.mean(dim=1)))


def known_head(model: nn.Module) -> Head | None:
    """The final norm and head of a known family, applied to the mean of one block's tokens; ``None`` if unknown."""
    names = {cls.__name__ for cls in type(model).__mro__}
    get = model.get_submodule
    if "VisionTransformer" in names and type(model).__module__.startswith("timm"):
        if getattr(model, "attn_pool", None) is not None:
            return None  # attention pooling: no mean-of-tokens head
        return _mean_head(get("norm"), nn.Sequential(get("fc_norm"), get("head_drop"), get("head")))
    if "VisionTransformer" in names and hasattr(model, "heads") and hasattr(model, "encoder"):
        return _mean_head(get("encoder.ln"), get("heads"))
    if "ViTForImageClassification" in names:
        return _mean_head(get("vit.layernorm"), get("classifier"))
    if "DeiTForImageClassificationWithTeacher" in names:
        cls_head, dist_head = get("cls_classifier"), get("distillation_classifier")
        return _mean_head(get("deit.layernorm"), lambda z: (cls_head(z) + dist_head(z)) / 2)
    if "DeiTForImageClassification" in names:
        return _mean_head(get("deit.layernorm"), get("cls_classifier"))
    if names & {"Dinov2ForImageClassification", "Dinov2WithRegistersForImageClassification"}:
        base = "dinov2" if hasattr(model, "dinov2") else "dinov2_with_registers"
        classifier = get("classifier")  # it reads [class token, patch mean]: both are the tokens' mean here
        return _mean_head(get(f"{base}.layernorm"), lambda z: classifier(torch.cat([z, z], dim=1)))
    if names & {"CLIPVisionModelWithProjection", "CLIPVisionModel"}:
        norm = get("vision_model.post_layernorm") if hasattr(model, "vision_model") else get("post_layernorm")
        return _mean_head(norm, get("visual_projection") if hasattr(model, "visual_projection") else nn.Identity())
    return None
