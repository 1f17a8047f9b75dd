"""LeGrad (:class:`LeGrad`) and its two ways through the blocks without every block's graph.

LeGrad's score of block ``l`` reads that block's output tokens through the model's final norm and
head, so ``ds_l / dA_l`` runs back through block ``l`` alone: block ``l``'s graph can be freed as
soon as that gradient is taken, before the next block runs.

* :meth:`LeGrad._single_pass`, when the classes are known before the forward: given (ints or an
  integer tensor), or the predicted class named first by a forward without graph. One forward in
  which each block read builds the graph of its attention onwards only (its queries, keys and values
  without autograd), its score is differentiated as soon as it returns, and its output goes on
  without graph. Where each sample is scored alone (a head camkit knows, the model called on the
  image alone) the batch runs in halves (``SINGLE_PASS_PARTS``): each half's forward plus one
  block's graph stays below the whole batch's forward.
* :meth:`LeGrad._recompute`, for callable targets (what they score is known only from the model's
  output): a forward without graph that keeps the first read block's input, then the blocks called
  again in order, each differentiated and freed before the next
  (:mod:`camkit.methods.attention.blockwise`).

Both give the maps of one backward through the whole graph up to rounding (the tests hold them to
1e-6).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..._internal.syncs import to_device
from ...errors import InvalidInputError, InvalidTargetError, LayerNotReachedError
from ...explanation import Explanation
from ...functional.attention import legrad_relevance
from ...hooks import HookScope
from ...targets.classes import OutputSelector, Target, given_classes, resolve_target, select_output
from ...targets.neuron import NeuronTarget
from .._core.binding import InputIndex
from ..registry import register_method
from .base import AttentionExplainer, Head, frozen_parameters, known_head
from .blockwise import BlockRecorder, micro_batches, replace_first
from .capture import AttentionCapture, first_tensor

__all__ = ["SINGLE_PASS_PARTS", "LeGrad"]

# the single pass runs the batch in this many parts: half the batch's forward plus one block's graph (its attention
# onwards: values, the MLP's input and hidden layer) stays below one forward of the whole batch
SINGLE_PASS_PARTS = 2


@dataclass
class _Pass:
    """What the single pass's block hooks share: each block's runs in this forward, the part of the batch
    running, and the relevance found [C, L, B, N - prefix] (allocated by the first block read)."""

    runs: list[int]
    part: slice = field(default_factory=lambda: slice(None))
    found: Tensor | None = None
    prefix: int = 0
    grid: tuple[int, ...] = ()


def _reads_tokens(model: nn.Module) -> bool:
    """Whether ``model`` has a language model's output head: its head is read on the LM path of a TokenTarget."""
    get = getattr(model, "get_output_embeddings", None)
    return callable(get) and isinstance(get(), nn.Module)


def _no_head(model: nn.Module) -> InvalidInputError:
    return InvalidInputError(
        f"LeGrad does not know the final norm and head of {type(model).__name__}; pass head= a callable "
        "taking one block's tokens [B, N, D] to what the target scores, e.g. "
        "lambda t: model.head(model.norm(t.mean(dim=1)))"
        + ("; a TokenTarget needs no head= (the language model's own is read)" if _reads_tokens(model) else "")
    )


@register_method("legrad")
class LeGrad(AttentionExplainer):
    """LeGrad (Bousselham et al., 2024): each layer's attention gradient of a score read at that layer.

    For block ``l`` the score ``s_l`` is the target applied to the model's own final norm and head
    on the mean of the block's output tokens (as the authors' code and torchcam 0.5.0 do).
    ``E_l`` is the mean over heads and queries of ``ReLU(ds_l / dA_l)``, keys without the prefix
    tokens; the map is the mean of ``E_l`` over the layers (:func:`camkit.functional.legrad_relevance`).
    Each block's score reaches its own attention only, so no block's graph outlives its gradient
    (:meth:`_single_pass`, :meth:`_recompute`): with the classes given (ints or an integer tensor), or the
    predicted class (``target=None``, named first by the model's own forward without graph), one
    forward per half of the batch differentiates each block read as soon as it has run, from its
    attention on (about 1.8x a no-grad forward's time, one more forward for ``target=None``, below
    its memory); for a callable target, a forward without graph keeps the first read block's input
    and the blocks are called again in order, about a quarter of the batch at a time, each
    differentiated alone (about 3x the time, one block input plus one call's graph). (A module in
    training mode, ``keep_mode=True``, or, on the second way, blocks that do not feed each other
    directly, take one forward with every block's graph, cut at each block's input.)

    On a GPU that whole graph is the faster way: one forward keeping every block's graph from its
    attention on (parameters frozen for the call), the scores of all layers read summed into one
    ``torch.autograd.grad`` over every layer's attention (block ``l``'s score reaches block ``l``'s
    attention only, so each gets its own gradient). ``path="auto"`` (the default) takes it whenever
    its memory, estimated from shapes before anything runs
    (:func:`camkit.methods.attention.budget.whole_graph_bytes`), fits the budget: ``max_memory``
    bytes, or on CUDA 80% of the device's free memory; on the CPU without ``max_memory`` the
    default stays block by block. ``extras["path"]`` (``"whole"`` or ``"blockwise"``),
    ``extras["estimated_bytes"]`` and ``extras["budget_bytes"]`` report the choice.

    Args:
        model: a vision transformer whose head camkit knows (timm's and torchvision's
            ``VisionTransformer``; Hugging Face ``ViTForImageClassification``, DeiT's classifiers,
            DINOv2's classifiers, ``CLIPVisionModelWithProjection`` (the projected embedding) and
            ``CLIPVisionModel`` (the pooled output)), or any with ``head=``; or a vision-language
            model explained for a :class:`~camkit.TokenTarget` (no ``head=``: its language model's
            own final norm and head are read, see :mod:`camkit.vlm.explainers`).
        head: a callable ``f(tokens [B, N, D]) -> output`` giving what the target scores from one
            block's tokens (the final norm and head on their mean); overrides the known head.
        layers: which attention layers are averaged (indices, negative from the end); ``None``: all.
            For a TokenTarget, indices of the language model's layers.
        path: ``"auto"`` (default: the whole graph where it fits the memory budget, else block by
            block), ``"whole"`` (one forward keeping every block's graph: 1.7-1.9x a no-grad
            forward's time on vit_b_16 at batch 8 on the CPU, but 13-14x its memory) or
            ``"blockwise"`` (no block's graph kept past its gradient, at about a no-grad forward's
            peak memory; see above). Same maps.
        max_memory: the budget in bytes for ``path="auto"``; ``None``: on CUDA 80% of the free
            device memory, elsewhere none (block by block).
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
        "where the whole graph fits the memory budget (max_memory=, or on CUDA 80% of the free memory): 1 forward "
        "keeping every block's graph from its attention on + 1 backward for all layers' scores; otherwise (the CPU's "
        "default) class targets: 1 forward per half batch, each block differentiated for its own score as it returns "
        "(target=None: 1 forward without a graph first); callable targets: 1 forward without a graph, then each block "
        "recomputed and differentiated; peak memory about a no-grad forward's"
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
        path: str = "auto",
        max_memory: int | None = None,
        query: str = "auto",
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, query=query, output=output, keep_mode=keep_mode, input_index=input_index)
        self._set_path(path, max_memory)
        if head is not None and not callable(head):
            raise TypeError(f"head must be a callable f(tokens [B, N, D]) -> output, got {type(head).__name__}")
        self._known_head = head is None
        self.head = head if head is not None else known_head(self.model)
        if self.head is None and not _reads_tokens(self.model):
            raise _no_head(self.model)
        count = len(self._modules)
        picked = list(range(count)) if layers is None else [int(i) for i in layers]
        if not picked or any(not -count <= i < count for i in picked):
            raise InvalidInputError(f"layers must be indices of the model's {count} attention layers, got {layers}")
        self.layers = sorted({i % count for i in picked})
        self._layers_given = None if layers is None else [int(i) for i in layers]

    def _token_options(self) -> dict[str, Any]:
        return {"layers": self._layers_given}  # indices of the language model's layers there

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        if self.head is None:
            raise _no_head(self.model)
        if isinstance(target, NeuronTarget):
            raise InvalidTargetError(
                "LeGrad scores each layer through the model's head, so a NeuronTarget (a hidden unit) has no score at "
                "each layer; explain a hidden unit with camkit.CheferRollout(model) instead"
            )
        choice = self._choose(x)
        blocks = self._replays(target, choice)
        explanation = None if blocks is None else self._by_block(x, target, blocks)
        if explanation is not None:
            return self._reported(explanation, choice, "blockwise")
        return self._reported(self._whole_graph(x, target), choice, "whole")

    def _by_block(self, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
        classes = given_classes(target, x.shape[0])
        if classes is not None:
            return self._single_pass(x, blocks, to_device(classes, x.device))  # pinned, not waited for
        if target is None:  # the predicted class, named by the model's own forward without graph
            with torch.no_grad():
                predicted, _ = resolve_target(None, self._forward(x), batch=x.shape[0])
            assert predicted is not None
            return self._single_pass(x, blocks, predicted)
        return self._recompute(x, target, blocks)

    def _whole_graph(self, x: Tensor, target: Target) -> Explanation:
        """One forward keeping every block's graph, cut at each block's input (parameters frozen), and one
        backward per score column of every read layer's score summed, for every layer's attention at once."""
        names = self.layer_names()
        head = self.head
        assert head is not None
        with frozen_parameters(self.model), AttentionCapture(self.model, gradients=True, blocks=True) as capture:
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

    def _single_pass(self, x: Tensor, blocks: list[nn.Module], classes: Tensor) -> Explanation:
        """LeGrad in one forward per part of the batch, for ``classes`` [B] or [B, K] given before it.

        The batch is split only where each sample is scored alone: a head camkit knows and the model called
        on the image alone (a ``head=`` of the caller's, or other inputs, take the whole batch at once).
        """
        names = self.layer_names()
        state = _Pass(runs=[0] * len(blocks))
        outputs = []
        split = self._known_head and self._call is None
        with (
            frozen_parameters(self.model),
            AttentionCapture(self.model, gradients=True, local=True) as capture,
            HookScope() as scope,
        ):
            for index, block in enumerate(blocks):
                scope.forward_pre(block, self._counted(state, capture, index))
                scope.forward(block, self._scored(state, capture, x, classes, index), own_thread=True)
            for part in micro_batches(x.shape[0], self._block_batch, SINGLE_PASS_PARTS) if split else [slice(None)]:
                state.part = part
                state.runs[:] = [0] * len(blocks)
                capture.live = False
                outputs.append(select_output(self._call_model(x[part]), self.output).detach())
                if any(state.runs[index] == 0 for index in self.layers):
                    missing = names[next(index for index in self.layers if state.runs[index] == 0)]
                    raise LayerNotReachedError(f"the block of '{missing}' did not run in the forward")
        assert state.found is not None
        output = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
        picked, scores = resolve_target(classes, output, batch=x.shape[0])
        return self._finish(list(state.found.mean(dim=1).unbind(0)), x, state.grid, picked, scores)

    def _counted(self, state: _Pass, capture: AttentionCapture, index: int) -> Callable[..., None]:
        """Block ``index``'s forward-pre hook in the single pass: its runs counted (one per forward), the capture
        live from the first block read to the last (the other blocks run the model's own attention)."""
        names = self.layer_names()
        first, final = self.layers[0], self.layers[-1]

        def hook(*_: Any) -> None:
            state.runs[index] += 1
            if state.runs[index] > 1:
                raise LayerNotReachedError(
                    f"the block of '{names[index]}' ran {state.runs[index]} times in one forward; attention methods "
                    "read each layer once per forward"
                )
            capture.live = first <= index <= final

        return hook

    def _scored(self, state: _Pass, capture: AttentionCapture, x: Tensor, classes: Tensor, index: int) -> Callable[..., Any]:
        """Block ``index``'s forward hook in the single pass: a block read has its own score differentiated as
        soon as it returns; its output goes on without graph."""
        first, final = self.layers[0], self.layers[-1]

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not first <= index <= final:
                return None
            tokens = first_tensor(output)
            if tokens is None:
                raise InvalidInputError(f"a transformer block returned {type(output).__name__}; camkit reads tensors [B, N, D]")
            attention = capture.take(index)
            if index in self.layers:
                self._score_block(state, x, classes, tokens, attention, index)
            capture.live = False
            return replace_first(output, tokens.detach())

        return hook

    def _score_block(self, state: _Pass, x: Tensor, classes: Tensor, tokens: Tensor, attention: Tensor, index: int) -> None:
        """Block ``index``'s score of ``classes`` (the running part's) differentiated with respect to its
        ``attention``: its relevance written into ``state.found``."""
        head = self.head
        assert head is not None
        read = head(tokens)
        logits = read if isinstance(read, Tensor) else select_output(read, self.output)
        _, scores = resolve_target(classes[state.part], logits, batch=tokens.shape[0])
        columns = self._columns(scores)
        if state.found is None:
            state.prefix, state.grid = self._layout(tokens.shape[1], x)[:2]
            state.found = torch.zeros(len(columns), len(self.layers), x.shape[0], tokens.shape[1] - state.prefix,
                                      device=tokens.device)
        name = self.layer_names()[index]
        for k, column in enumerate(columns):
            (grad,) = self._grads(torch.stack([column.sum()]), [attention], [name], k < len(columns) - 1)
            with torch.no_grad():
                state.found[k, self.layers.index(index), state.part] = legrad_relevance([grad], state.prefix)

    def _recompute(self, x: Tensor, target: Target, blocks: list[nn.Module]) -> Explanation | None:
        """LeGrad by a forward without graph, then the blocks called again in order; ``None`` where they cannot be."""
        first = self.layers[0]
        with (
            AttentionCapture(self.model, gradients=True, local=True) as capture,
            BlockRecorder(blocks, leaves=False, keep=[first]) as recorder,
        ):
            recorded = self._recorded_forward(capture, recorder, x, target)
            if recorded is None:
                return None
            classes, scores = recorded
            columns = len(self._columns(scores))
            # a known head and a class target score each sample alone: the blocks run on slices of the batch
            split = classes is not None and self._known_head
            call = recorder.calls[first][0]
            kept = call.tokens
            assert kept is not None  # the first block read keeps its input
            prefix, grid, _ = self._layout(kept.shape[1], x)
            # per column, per layer read: the relevance [B, N - prefix], allocated once before the blocks run
            # (small results allocated between the blocks' large temporaries keep the C heap from shrinking)
            found = torch.zeros(columns, len(self.layers), kept.shape[0], kept.shape[1] - prefix, device=kept.device)
            for part in call.slices(self._block_batch) if split else [slice(None)]:
                picked = None if classes is None else classes[part]
                self._recompute_part(capture, recorder, blocks, kept[part], picked, target, scores.dim() == 2, found, part, prefix)
            rows = list(found.mean(dim=1).unbind(0))
        return self._finish(rows, x, grid, classes, scores)

    def _recompute_part(
        self, capture: AttentionCapture, recorder: BlockRecorder, blocks: Sequence[nn.Module], kept: Tensor,
        picked: Tensor | None, target: Target, multi: bool, found: Tensor, part: slice, prefix: int,
    ) -> None:
        """From the first block read on, each block called again on the previous one's output (the samples
        ``part``, their kept input ``kept``), its own score differentiated and its graph freed before the next."""
        names = self.layer_names()
        head = self.head
        assert head is not None
        tokens = kept.detach()
        for index in range(self.layers[0], self.layers[-1] + 1):
            with torch.enable_grad():
                out = recorder.calls[index][0].run(blocks[index], tokens)
                attention = capture.take(index)
                if index in self.layers:
                    read = head(out)
                    for k in range(found.shape[0]):
                        score = self._layer_score(read, picked, target, k, multi)
                        total = torch.stack([score.sum()])  # as the whole-graph path
                        (grad,) = self._grads(total, [attention], [names[index]], k < found.shape[0] - 1)
                        with torch.no_grad():
                            found[k, self.layers.index(index), part] = legrad_relevance([grad], prefix)
                    del read
                tokens = out.detach()
                del out, attention
