"""Explanations made for vision transformers: attention rollout, Chefer's gradient rollout and LeGrad.

Each reads the model's attention probabilities ``A_l`` [B, heads, N, N] during one forward
(:class:`camkit.methods._attention.AttentionCapture`: timm, torchvision and Hugging Face ViTs,
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

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from .._internal.syncs import to_device
from ..errors import InvalidInputError, InvalidTargetError, LayerNotReachedError
from ..explanation import Explanation
from ..functional.attention import (
    attention_rollout,
    fuse_heads,
    gradient_rollout,
    legrad_relevance,
    token_relevance,
)
from ..functional.tokens import infer_token_grid
from ..layers.layout import prefix_token_hint
from ..registry import register_method
from ..targets.classes import OutputSelector, Target, resolve_target, select_output
from ..targets.neuron import NeuronTarget
from ._attention import AttentionCapture, attention_modules
from ._blockwise import BlockRecorder, attention_blocks, segment_length
from ._chefer import from_last_segment, query_row, segments_back
from ._core.binding import InputIndex
from ._core.explainer import Explainer
from ._core.output import make_explanation
from ._legrad import given_classes, recompute, single_pass

__all__ = ["AttentionExplainer", "AttentionRollout", "CheferRollout", "LeGrad"]

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
    # the gradient methods differentiate one block at a time (camkit.methods._blockwise); False: one
    # backward through the graph of every block (also what a model or target it cannot replay gets)
    _blockwise: bool = True
    # samples per block call in that path (camkit.methods._blockwise.micro_batches); None: about a quarter of the batch
    _block_batch: int | None = None
    # blocks per segment of CheferRollout's backward (camkit.methods._blockwise.segment_length); None: ceil(sqrt(L))
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

    def _replays(self, target: Target) -> list[nn.Module] | None:
        """The blocks to call again one at a time, or ``None`` for the whole-graph path.

        Not when a module is in training mode (dropout would draw new masks), nor for a target that
        reads a hidden layer (its score is on no graph in a forward without one).
        """
        if not self._blockwise or callable(getattr(target, "bind_model", None)):
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


def _flag(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidInputError(f"{name} must be True or False, got {value!r}")


@register_method("attentionrollout")
class AttentionRollout(AttentionExplainer):
    """Attention rollout (Abnar & Zuidema, ACL 2020): attention propagated through the layers, class-agnostic.

    ``Ā_l = 0.5 * fuse_heads(A_l) + 0.5 * I`` with rows renormalised, ``R = Ā_L ··· Ā_1``; the map is
    the class token's row of ``R`` over the patch tokens (see :func:`camkit.functional.attention_rollout`).
    The map does not depend on the target: every class gets the same map (``target`` still picks
    the scores reported).

    Args:
        model: a vision transformer.
        head_fusion: how heads are fused: ``"mean"`` (the paper), ``"max"`` or ``"min"``.
        discard_ratio: the fraction of each fused matrix's lowest entries set to zero (0: none).
        query, output, keep_mode, input_index: see :class:`AttentionExplainer`.

    Example:
        >>> import torch
        >>> from torchvision.models import VisionTransformer
        >>> import camkit
        >>> vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16)
        >>> e = camkit.AttentionRollout(vit, head_fusion="max", discard_ratio=0.5).explain(torch.rand(2, 3, 16, 16))
        >>> tuple(e.raw.shape), tuple(e.maps.shape)
        ((2, 4, 4), (2, 16, 16))
    """

    needs_grad: ClassVar[bool] = False
    cost: ClassVar[str] = "1 forward (no backward), the attention computed unfused"
    use_when: ClassVar[str] = (
        "You want where a ViT's information flows, fast and class-agnostic (the same map for every class)."
    )

    def __init__(
        self,
        model: nn.Module,
        *,
        head_fusion: str = "mean",
        discard_ratio: float = 0.0,
        query: str = "auto",
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, query=query, output=output, keep_mode=keep_mode, input_index=input_index)
        if head_fusion not in ("mean", "max", "min"):
            raise InvalidInputError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
        if not 0.0 <= discard_ratio < 1.0:
            raise InvalidInputError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
        self.head_fusion = head_fusion
        self.discard_ratio = float(discard_ratio)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        fusion = self.head_fusion
        # heads fused as each layer runs: one [B, N, N] per layer is kept, not [B, heads, N, N]
        with AttentionCapture(self.model, gradients=False, reduce=lambda a: fuse_heads(a.float(), fusion)[:, None]) as capture:
            classes, scores = self._target_scores(x, target)
            fused = capture.attentions()
        prefix, grid, query = self._layout(fused[0].shape[-1], x)
        rollout = attention_rollout(fused, head_fusion=fusion, discard_ratio=self.discard_ratio)  # one head: fused
        row = token_relevance(rollout, prefix, query=query)
        return self._finish([row] * len(self._columns(scores)), x, grid, classes, scores)


@register_method("cheferrollout")
class CheferRollout(AttentionExplainer):
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf, "Generic Attention-model Explainability", ICCV 2021).

    ``R = I``; for each layer ``R <- R + mean_heads((dA_l ⊙ A_l)^+) R``, with ``dA_l`` the gradient
    of the target's score with respect to the layer's attention probabilities; the map is the
    class token's row of ``R`` over the patch tokens (see :func:`camkit.functional.gradient_rollout`).

    The gradients come a few blocks at a time: a forward without graph keeps the input of every
    ``ceil(sqrt(L))``-th block, then from the last segment of blocks to the first the segment is
    called again from its input and differentiated, the gradient with respect to its input going
    on to the previous segment; each segment is called on a few samples at a time (samples are
    independent in a block in eval mode). The peak memory is about ``sqrt(L)`` block inputs plus
    one such call's graph, not the graph of every block. On a model family camkit knows (timm's,
    torchvision's and Hugging Face's ViTs, DeiT, DINOv2, CLIP's vision tower) called on the image
    alone, with a class target or ``target=None``, the forward without graph stops at the last
    segment: that segment, the head and the score then run once, inside the model's own forward
    on each few samples (the blocks before it standing in for themselves), instead of once in the
    forward and again to be differentiated. A model
    with a module in training mode (``keep_mode=True``), a target read inside the model
    (:class:`~camkit.NeuronTarget`) or blocks that do not feed each other directly take one
    backward through the whole graph instead; the maps are the same either way.

    Args:
        model: a vision transformer (see :class:`AttentionExplainer`).
        recompute: ``True`` (default): blocks called again a segment at a time, at about a no-grad
            forward's peak memory (batch 8, CPU: 3.1x its time on vit_b_16, 3.5x on vit_small);
            ``False``: one backward through every block's graph, faster (2.4x a forward on vit_b_16)
            but 16x its memory. Same maps.
        query, output, keep_mode, input_index: see :class:`AttentionExplainer`.

    Example:
        >>> import torch
        >>> from torchvision.models import VisionTransformer
        >>> import camkit
        >>> vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16,
        ...                         num_classes=3)
        >>> camkit.CheferRollout(vit)(torch.rand(2, 3, 16, 16), target=[0, 2]).shape
        torch.Size([2, 16, 16])
    """

    cost: ClassVar[str] = (
        "1 forward without a graph (the model's own attention), then the blocks recomputed, attention unfused, and "
        "differentiated a segment of about sqrt(L) at a time, last to first: about 1 more forward + 1 backward (known "
        "ViT families with class targets: the first forward stops before the last segment); peak memory sqrt(L) "
        "block inputs + one segment's graph for a few samples"
    )
    use_when: ClassVar[str] = (
        "You want a class-specific map of a ViT that reads its class token: the attention weighted by the score's gradient."
    )

    def __init__(
        self,
        model: nn.Module,
        *,
        recompute: bool = True,
        query: str = "auto",
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, query=query, output=output, keep_mode=keep_mode, input_index=input_index)
        self._blockwise = _flag(recompute, "recompute")

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        blocks = self._replays(target)
        explanation = None
        # a family camkit knows (tokens meet only within a sample, from the input to the head) called on the image
        # alone: the model's own forward may run on a few samples at a time
        if blocks is not None and self._call is None and known_head(self.model) is not None:
            explanation = from_last_segment(self, x, target, blocks)
        if blocks is not None and explanation is None:
            explanation = self._by_block(x, target, blocks)
        return explanation if explanation is not None else self._whole_graph(x, target)

    def _by_block(self, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
        every = self._segment or segment_length(len(blocks))
        firsts = list(range(0, len(blocks), every))
        with (
            AttentionCapture(self.model, gradients=True) as capture,
            BlockRecorder(blocks, leaves=True, keep=firsts) as recorder,
        ):
            recorded = self._recorded_forward(capture, recorder, x, target)
            if recorded is None:
                return None
            classes, scores = recorded
            columns = self._columns(scores)
            if not all(column.requires_grad for column in columns):
                raise LayerNotReachedError("the score does not depend on the model's attention: no graph links them")
            torch.set_grad_enabled(True)  # AttentionCapture puts the caller's mode back
            last = len(columns) - 1
            # what the score reads of each block's output directly (the last block's: all of it)
            read = recorder.outputs_read(columns)
            wanted = [i for i, out in enumerate(read) if out is not None]
            leaves = [out for out in read if out is not None]
            upstream: list[list[Tensor | None]] = []
            for k, column in enumerate(columns):
                got = torch.autograd.grad(column.sum(), leaves, retain_graph=k < last, allow_unused=True) if leaves else ()
                grads: list[Tensor | None] = [None] * len(blocks)
                for i, grad in zip(wanted, got):
                    grads[i] = grad
                upstream.append(grads)
            del read, leaves, got
            # a segment's graph holds `every` blocks: a micro-batch of about batch / (2 * every) samples keeps
            # it near half a block's graph for the whole batch
            call = recorder.calls[0][0]
            parts = call.slices(self._block_batch, 2 * every)
            # R = (I + C_L) ··· (I + C_1) is read through one query row v (token_relevance's): from the last
            # layer down, w <- w + w C_l, kept as d = w - v [C, B, 1, N] (the identity's share is not rounded
            # into each step). d is allocated before the blocks run (small results allocated between large
            # temporaries keep the C heap from shrinking).
            entry = cast(Tensor, call.tokens)  # the first block's input, kept: [B, N, D] on the model's device
            prefix, grid, query = self._layout(entry.shape[1], x)
            start = query_row(entry.new_empty(1, 1, entry.shape[1], dtype=torch.float32), query)  # v [1, 1, N]
            rows = entry.new_zeros(len(columns), call.batch, 1, entry.shape[1], dtype=torch.float32)
            segments_back(self, capture, recorder, blocks, firsts, every, upstream, rows, start, parts)
            found = [(start + row)[:, 0, prefix:] for row in rows]
        return self._finish(found, x, grid, classes, scores)

    def _whole_graph(self, x: Tensor, target: Target) -> Explanation:
        names = self.layer_names()
        with AttentionCapture(self.model, gradients=True) as capture:
            classes, scores = self._target_scores(x, target)
            attentions = capture.attentions()
            columns = self._columns(scores)
            rows = []
            for k, column in enumerate(columns):
                grads = self._grads(column, attentions, names, k < len(columns) - 1)
                with torch.no_grad():
                    relevance = gradient_rollout([a.detach() for a in attentions], grads)
                    prefix, grid, query = self._layout(relevance.shape[-1], x)
                    rows.append(token_relevance(relevance, prefix, query=query))
        return self._finish(rows, x, grid, classes, scores)


@register_method("legrad")
class LeGrad(AttentionExplainer):
    """LeGrad (Bousselham et al., 2024): each layer's attention gradient of a score read at that layer.

    For block ``l`` the score ``s_l`` is the target applied to the model's own final norm and head
    on the mean of the block's output tokens (as the authors' code and torchcam 0.5.0 do).
    ``E_l`` is the mean over heads and queries of ``ReLU(ds_l / dA_l)``, keys without the prefix
    tokens; the map is the mean of ``E_l`` over the layers (:func:`camkit.functional.legrad_relevance`).
    Each block's score reaches its own attention only, so no block's graph outlives its gradient
    (:mod:`camkit.methods._legrad`): with the classes given (ints or an integer tensor), or the
    predicted class (``target=None``, named first by the model's own forward without graph), one
    forward per half of the batch differentiates each block read as soon as it has run, from its
    attention on (about 1.8x a no-grad forward's time, one more forward for ``target=None``, below
    its memory); for a callable target, a forward without graph keeps the first read block's input
    and the blocks are called again in order, about a quarter of the batch at a time, each
    differentiated alone (about 3x the time, one block input plus one call's graph). (A module in
    training mode, ``keep_mode=True``, or, on the second way, blocks that do not feed each other
    directly, take one forward with every block's graph, cut at each block's input.)

    Args:
        model: a vision transformer whose head camkit knows (timm's and torchvision's
            ``VisionTransformer``; Hugging Face ``ViTForImageClassification``, DeiT's classifiers,
            DINOv2's classifiers, ``CLIPVisionModelWithProjection`` (the projected embedding) and
            ``CLIPVisionModel`` (the pooled output)), or any with ``head=``.
        head: a callable ``f(tokens [B, N, D]) -> output`` giving what the target scores from one
            block's tokens (the final norm and head on their mean); overrides the known head.
        layers: which attention layers are averaged (indices, negative from the end); ``None``: all.
        recompute: ``True`` (default): no block's graph kept past its gradient, at about a no-grad
            forward's peak memory (see above); ``False``: one forward keeping every block's graph
            (1.7-1.9x a forward's time on vit_b_16, batch 8, CPU, but 13-14x its memory). Same maps.
        query, output, keep_mode, input_index: see :class:`AttentionExplainer`.

    Example:
        >>> import torch
        >>> from torchvision.models import VisionTransformer
        >>> import camkit
        >>> vit = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16,
        ...                         num_classes=3)
        >>> camkit.LeGrad(vit, layers=[-1])(torch.rand(2, 3, 16, 16), target=1).shape
        torch.Size([2, 16, 16])
    """

    cost: ClassVar[str] = (
        "class targets: 1 forward per half batch, attention unfused, each block differentiated for its own score "
        "as it returns (about 1 forward + 1 partial backward; target=None: 1 forward without a graph first); "
        "callable targets: 1 forward without a graph, then each block recomputed and differentiated (about 1 more "
        "forward + 1 backward); peak memory about a no-grad forward's"
    )
    use_when: ClassVar[str] = (
        "You want a sharp per-layer ViT map on a token-pooling model or CLIP (text-specific); it scores the mean token."
    )

    def __init__(
        self,
        model: nn.Module,
        *,
        head: Head | None = None,
        layers: Sequence[int] | None = None,
        recompute: bool = True,
        query: str = "auto",
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, query=query, output=output, keep_mode=keep_mode, input_index=input_index)
        self._blockwise = _flag(recompute, "recompute")
        if head is not None and not callable(head):
            raise TypeError(f"head must be a callable f(tokens [B, N, D]) -> output, got {type(head).__name__}")
        self._known_head = head is None
        self.head = head if head is not None else known_head(self.model)
        if self.head is None:
            raise InvalidInputError(
                f"LeGrad does not know the final norm and head of {type(self.model).__name__}; pass head= a callable "
                "taking one block's tokens [B, N, D] to what the target scores, e.g. "
                "lambda t: model.head(model.norm(t.mean(dim=1)))"
            )
        count = len(self._modules)
        picked = list(range(count)) if layers is None else [int(i) for i in layers]
        if not picked or any(not -count <= i < count for i in picked):
            raise InvalidInputError(f"layers must be indices of the model's {count} attention layers, got {layers}")
        self.layers = sorted({i % count for i in picked})

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        if isinstance(target, NeuronTarget):
            raise InvalidTargetError(
                "LeGrad scores each layer through the model's head, so a NeuronTarget (a hidden unit) has no score at "
                "each layer; explain a hidden unit with camkit.CheferRollout(model) instead"
            )
        blocks = self._replays(target)
        explanation = None if blocks is None else self._by_block(x, target, blocks)
        return explanation if explanation is not None else self._whole_graph(x, target)

    def _by_block(self, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
        classes = given_classes(target, x.shape[0])
        if classes is not None:
            return single_pass(self, x, blocks, to_device(classes, x.device))  # pinned, not waited for
        if target is None:  # the predicted class, named by the model's own forward without graph
            with torch.no_grad():
                predicted, _ = resolve_target(None, self._forward(x), batch=x.shape[0])
            assert predicted is not None
            return single_pass(self, x, blocks, predicted)
        return recompute(self, x, target, blocks)

    def _whole_graph(self, x: Tensor, target: Target) -> Explanation:
        names = self.layer_names()
        head = self.head
        assert head is not None
        with AttentionCapture(self.model, gradients=True, blocks=True) as capture:
            classes, scores = self._target_scores(x, target)
            attentions = [capture.attentions()[i] for i in self.layers]
            outputs = [capture.block_outputs()[i] for i in self.layers]
            read = [head(tokens) for tokens in outputs]
            columns = self._columns(scores)
            rows = []
            for k in range(len(columns)):
                layer_scores = [self._layer_score(out, classes, target, k, scores.dim() == 2) for out in read]
                total = torch.stack([s.sum() for s in layer_scores]).sum()
                grads = self._grads(total, attentions, [names[i] for i in self.layers], k < len(columns) - 1)
                with torch.no_grad():
                    prefix, grid, _ = self._layout(grads[0].shape[-1], x)
                    rows.append(legrad_relevance(grads, prefix))
        return self._finish(rows, x, grid, classes, scores)

    def _layer_score(self, out: Any, classes: Tensor | None, target: Target, k: int, multi: bool) -> Tensor:
        if classes is None:  # a callable target scores what the head gives
            score = target(out) if callable(target) else None
            if not isinstance(score, Tensor):
                raise InvalidInputError("a callable target must return a tensor from the head's output")
            return score[:, k] if multi else score
        logits = select_output(out, self.output) if not isinstance(out, Tensor) else out
        index = classes[:, k] if multi else classes
        return logits.gather(1, index[:, None])[:, 0]


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
