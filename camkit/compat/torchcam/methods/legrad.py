"""torchcam 0.5.0's LeGrad on camkit's :func:`camkit.functional.legrad_relevance`.

Each target block's ``self_attention`` (a batch-first :class:`torch.nn.MultiheadAttention`)
is made to return its per-head probabilities while the user's forward pass runs; the block's
tokens are scored by ``score_projection``; ``extractor(class_idx, scores)`` then differentiates
each block's own score with respect to its attention probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
from torch import Tensor, nn

from ....functional import legrad_relevance
from ....methods.attention.capture import mha_output, mha_unreadable, mha_values
from .core import _CAM, OutputTarget

__all__ = ["LeGrad"]


def _check_options(prefix_tokens: Any, grid_shape: Any, score_projection: Any) -> None:
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int):
        raise TypeError(f"`prefix_tokens` must be an integer, got {prefix_tokens!r}")
    if prefix_tokens < 0:
        raise ValueError(f"`prefix_tokens` must be non-negative, got {prefix_tokens}")
    if grid_shape is not None:
        if not isinstance(grid_shape, tuple) or len(grid_shape) != 2 or any(not isinstance(d, int) for d in grid_shape):
            raise TypeError(f"`grid_shape` must be a tuple of two integers, got {grid_shape!r}")
        if any(d <= 0 for d in grid_shape):
            raise ValueError(f"`grid_shape` dimensions must be positive, got {grid_shape}")
    if score_projection is not None and not callable(score_projection):
        raise TypeError(f"`score_projection` must be callable, got {type(score_projection).__name__}")


_UNREADABLE = {
    "batch_first": "requires batch-first attention (batch_first=True)",
    "projection": "requires shared-dimension Q/K/V projections (one in_proj_weight)",
    "added_tokens": "does not support added attention tokens (bias_kv, add_zero_attn)",
}


def _check_attention(attention: nn.MultiheadAttention, name: str) -> None:
    reason = mha_unreadable(attention)
    if reason is not None:
        raise ValueError(f"target block '{name}' {_UNREADABLE[reason]}")


class LeGrad(_CAM):
    """LeGrad (Bousselham et al. 2024) with torchcam's contract: explicit target blocks, maps on the patch grid.

    For each block, the positive gradients of the block's own class score (``score_projection``
    of its output tokens) with respect to its attention probabilities, averaged over heads and
    queries, prefix keys dropped; the maps are averaged over the blocks
    (:func:`camkit.functional.legrad_relevance`). camkit's native :class:`camkit.LeGrad`
    computes the same relevance from the model alone (it finds the attention layers itself).

    Args:
        model: input model
        target_layer: transformer block(s), as modules or names, each with a ``self_attention`` child
        score_projection: maps a block's tokens [B, N, D] to class logits [B, classes]; default:
            torchvision ``VisionTransformer``'s ``heads(encoder.ln(tokens.mean(1)))``
        prefix_tokens: non-patch tokens leading the keys
        grid_shape: the patch grid ``(h, w)``; inferred when the patch count is a square
        enable_hooks: whether hooks are enabled at construction
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str],
        *,
        score_projection: Callable[[Tensor], Tensor] | None = None,
        prefix_tokens: int = 1,
        grid_shape: tuple[int, int] | None = None,
        enable_hooks: bool = True,
    ) -> None:
        if target_layer is None or (isinstance(target_layer, list) and not target_layer):
            raise ValueError("LeGrad requires at least one explicit target block")
        _check_options(prefix_tokens, grid_shape, score_projection)
        if score_projection is None:
            norm = getattr(getattr(model, "encoder", None), "ln", None)
            heads = getattr(model, "heads", None)
            if not isinstance(norm, nn.Module) or not isinstance(heads, nn.Module):
                raise ValueError(
                    "`score_projection` is required for models other than torchvision VisionTransformer: pass a "
                    "callable mapping a block's tokens [B, N, D] to class logits [B, classes]"
                )

            def score_projection(tokens: Tensor) -> Tensor:
                return heads(norm(tokens.mean(dim=1)))

        self._score_projection = score_projection
        self.prefix_tokens = prefix_tokens
        self.grid_shape = grid_shape
        super().__init__(model, target_layer, enable_hooks=enable_hooks)
        self._score_used = False
        try:
            for idx, name in enumerate(self.target_names):
                attention = getattr(self.submodule_dict[name], "self_attention", None)
                if not isinstance(attention, nn.MultiheadAttention):
                    raise TypeError(f"target block '{name}' must expose `self_attention: nn.MultiheadAttention`")
                _check_attention(attention, name)
                self.hook_handles.append(self._scope.forward_pre(attention, partial(self._prepare_attention, idx=idx), with_kwargs=True))
                self.hook_handles.append(self._scope.forward(attention, partial(self._capture_attention, idx=idx), with_kwargs=True))
        except Exception:
            self.remove_hooks()
            raise

    def reset_hooks(self) -> None:
        """Clear the stored layer scores and attention probabilities."""
        super().reset_hooks()
        self.hook_attn: list[Tensor | None] = [None] * len(self.target_names)
        self._token_counts: list[int | None] = [None] * len(self.target_names)
        self._weight_options: list[tuple[bool, bool] | None] = [None] * len(self.target_names)

    def _activation_hook(self, idx: int) -> Callable[..., None]:
        def hook(_: nn.Module, _input: tuple[Tensor, ...], output: Any) -> None:
            if not self._hooks_enabled:
                return
            if not isinstance(output, Tensor) or output.ndim != 3:
                raise ValueError("LeGrad target blocks must return tokens shaped (batch, tokens, embedding)")
            scores = self._score_projection(output)
            if not isinstance(scores, Tensor) or scores.ndim != 2 or scores.shape[0] != output.shape[0]:
                got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
                raise ValueError(f"`score_projection` must return class logits shaped (batch, classes), got {got}")
            self.hook_a[idx] = scores
            self._token_counts[idx] = output.shape[1]

        return hook

    def _prepare_attention(
        self, module: nn.MultiheadAttention, args: tuple[Any, ...], kwargs: dict[str, Any], idx: int = 0
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The attention's forward-pre hook: per-head probabilities asked for, the caller's request remembered."""
        if not self._hooks_enabled:
            return None
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            raise RuntimeError("LeGrad requires a forward pass with gradient tracking enabled")
        if module.training and module.dropout > 0:
            raise ValueError("LeGrad does not support active attention dropout: call model.eval()")
        if len(args) < 3 or any(not isinstance(a, Tensor) for a in args[:3]):
            raise ValueError("LeGrad requires tensor query, key, and value inputs passed positionally")
        query, key, value = args[:3]
        if query is not key or query is not value:
            raise ValueError("LeGrad only supports self-attention (query, key and value the same tensor)")
        if query.ndim != 3:
            raise ValueError("LeGrad requires attention inputs shaped (batch, tokens, embedding)")
        args_l = list(args)
        bias = module.in_proj_bias
        if not (query.requires_grad or module.in_proj_weight.requires_grad or (bias is not None and bias.requires_grad)):
            query = query.detach().requires_grad_()  # a graph to the probabilities, parameters untouched
            args_l[:3] = [query, query, query]
        self._weight_options[idx] = (
            bool(args_l[4] if len(args_l) > 4 else kwargs.get("need_weights", True)),
            bool(args_l[6] if len(args_l) > 6 else kwargs.get("average_attn_weights", True)),
        )
        kwargs = dict(kwargs)
        for position, key_name, forced in ((4, "need_weights", True), (6, "average_attn_weights", False)):
            if len(args_l) > position:
                args_l[position] = forced
            else:
                kwargs[key_name] = forced
        return tuple(args_l), kwargs

    def _capture_attention(
        self,
        module: nn.MultiheadAttention,
        args: tuple[Any, ...],
        _kwargs: dict[str, Any],
        output: Any,
        idx: int = 0,
    ) -> tuple[Tensor, Tensor | None] | None:
        """The attention's forward hook: keeps the probabilities on the score's path, returns what the caller asked for."""
        if not self._hooks_enabled:
            return None
        if not isinstance(output, tuple) or len(output) != 2 or not isinstance(output[1], Tensor):
            raise ValueError("LeGrad requires per-head attention probabilities from `nn.MultiheadAttention`")
        attention, value = output[1], args[2]
        if not isinstance(value, Tensor) or attention.ndim != 4:
            raise ValueError("LeGrad requires attention probabilities shaped (batch, heads, queries, keys)")
        batch, length, _ = value.shape
        if attention.shape[0] != batch or attention.shape[1] != module.num_heads or attention.shape[-1] != length:
            raise ValueError(
                f"incompatible attention probability shape {tuple(attention.shape)} for values {tuple(value.shape)}"
            )
        self.hook_attn[idx] = attention
        options = self._weight_options[idx]
        if options is None:
            raise RuntimeError("missing original attention return options: the pre-forward hook did not run")
        requested, averaged = options
        weights = (attention.mean(dim=1) if averaged else attention) if requested else None
        # the block's output recomputed from the captured probabilities, so they are on the score's path
        return mha_output(module, attention, mha_values(module, value)), weights

    def _precheck(self, class_idx: int | list[int] | None, scores: Any = None, targets: Any = None) -> None:
        if targets is not None:
            raise ValueError("LeGrad does not support arbitrary output targets")
        super()._precheck(class_idx, scores, targets)
        if any(not isinstance(a, Tensor) for a in self.hook_attn):
            raise AssertionError("Inputs need to be forwarded through every LeGrad target block")

    def _grid(self, patches: int) -> tuple[int, int]:
        if patches <= 0:
            raise ValueError("`prefix_tokens` must leave at least one patch token")
        if self.grid_shape is not None:
            if self.grid_shape[0] * self.grid_shape[1] != patches:
                raise ValueError(f"`grid_shape` {self.grid_shape} does not match the number of patch tokens ({patches})")
            return self.grid_shape
        side = math.isqrt(patches)
        if side * side != patches:
            raise ValueError(f"unable to infer a square patch grid from {patches} patch tokens; specify `grid_shape`")
        return side, side

    def compute_cams(
        self,
        class_idx: int | list[int] | None = None,
        scores: Any = None,
        normalized: bool = True,
        retain_graph: bool = False,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
        **kwargs: Any,
    ) -> list[Tensor]:
        """One map [B, h, w] on the patch grid: the blocks' relevances averaged.

        Raises:
            ValueError: if targets are given, or attention and token shapes disagree
            RuntimeError: if a block's score does not depend on its attention
        """
        if targets is not None:
            raise ValueError("LeGrad does not support arbitrary output targets")
        grads = []
        last = len(self.target_names) - 1
        for idx, (layer_scores, attention) in enumerate(zip(self.hook_a, self.hook_attn, strict=True)):
            if not isinstance(layer_scores, Tensor) or not isinstance(attention, Tensor):
                raise AssertionError("Inputs need to be forwarded through every LeGrad target block")
            if isinstance(class_idx, int):
                chosen = layer_scores[:, class_idx]
            else:
                chosen = layer_scores.gather(1, torch.tensor(class_idx, device=layer_scores.device).view(-1, 1))
            try:
                (grad,) = torch.autograd.grad(chosen.sum(), attention, retain_graph=retain_graph or idx < last)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"layer-specific score for '{self.target_names[idx]}' is not connected to its attention"
                ) from exc
            tokens = self._token_counts[idx]
            if tokens is None or tokens != grad.shape[-1]:
                raise ValueError("attention keys and target-block tokens must have matching lengths")
            grads.append(grad)
        relevance = legrad_relevance(grads, prefix=self.prefix_tokens) if grads[0].shape[-1] > self.prefix_tokens else None
        h, w = self._grid(0 if relevance is None else relevance.shape[-1])
        with torch.no_grad():
            cam = cast(Tensor, relevance).to(grads[0].dtype).reshape(-1, h, w)
            return [self._normalize(cam) if normalized else cam]

    def _extra_repr(self) -> str:
        return f"target_layer={self.target_names}, prefix_tokens={self.prefix_tokens}"
