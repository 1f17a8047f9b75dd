"""Attention probabilities of a vision transformer, read during one forward, and ``nn.MultiheadAttention``'s parts.

:class:`AttentionCapture` finds the model's attention modules, switches each to the path that
computes its probabilities explicitly from its own queries and keys, for the call only, and
records those probabilities ``A`` [B, heads, N, N] layer by layer, on the graph of the output:

* timm's ``Attention`` (``fused_attn`` set to ``False`` for the call): ``A`` is read where it
  enters ``attn_drop``, and handed on from there.
* Hugging Face ViT, DeiT, DINOv2 (with registers too) and CLIP vision (``q_proj``/``k_proj``
  attention modules): their config's attention implementation set to ``"eager"`` for the call;
  ``A`` is the weights the module returns, the very tensor it multiplied with the values.
* ``nn.MultiheadAttention`` (torchvision's encoder blocks): its forward is replaced for the call by
  one that computes ``A`` from its packed projection and mixes its output ``out_proj(A @ V)`` from
  that ``A``. With masks, dropout in training mode or options it does not know, the module's own
  unfused path runs instead, asked for per-head weights; those are a view taken after its output,
  which the output's gradient does not reach, so with gradients the output is mixed again from them
  (values from its own projection).

Every setting is put back and every hook removed when the block ends, also after an error.
Windowed attention (Swin) is refused, and so is any other module whose class name says
attention, with its class named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._internal.state import GradModes
from ...errors import InvalidInputError, LayerNotReachedError
from ...hooks import HookScope

__all__ = [
    "AttentionCapture", "attention_modules", "block_of", "first_tensor", "mha_output", "mha_unreadable", "mha_values",
]  # fmt: skip

_WINDOWED = ("Window", "Swin")
_SWIN_HINT = (
    "windowed attention (Swin) has no [N, N] attention over the image's tokens, so rollout, Chefer's method "
    "and LeGrad do not apply to it; explain it with a CAM on its last stage (camkit.GradCAM(model), whose "
    "default layer knows Swin's channel-last maps) or a gradient attribution (camkit.IntegratedGradients)"
)


def _kind(module: nn.Module) -> str | None:
    if isinstance(module, nn.MultiheadAttention):
        return "mha"
    names = [cls.__name__ for cls in type(module).__mro__]
    if not any("Attention" in name for name in names[:-2]):
        return None
    if any(word in names[0] for word in _WINDOWED):
        return "windowed"
    if type(module).__module__.startswith("timm") and all(hasattr(module, a) for a in ("qkv", "attn_drop", "fused_attn")):
        return "timm"
    config = getattr(module, "config", None)
    if hasattr(module, "q_proj") and hasattr(module, "k_proj") and hasattr(config, "_attn_implementation"):
        return "hf"
    return "unknown"


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """The model's self-attention modules ``(name, module, kind)`` in registration order.

    Raises:
        InvalidInputError: when there is none, when one is windowed (Swin), or when a module whose
            class says attention is of a kind camkit cannot read (its class is named).
    """
    found: list[tuple[str, nn.Module, str]] = []
    inside: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(outer + ".") for outer in inside):
            continue  # a known attention module's own parts (its projections) are read with it
        kind = _kind(module)
        if kind is None:
            continue
        if kind == "windowed":
            raise InvalidInputError(f"{type(module).__name__} at '{name}': {_SWIN_HINT}.")
        if kind == "unknown":
            raise InvalidInputError(
                f"camkit cannot read the attention probabilities of {type(module).__module__}."
                f"{type(module).__name__} (at '{name}'): it knows timm's Attention, nn.MultiheadAttention "
                "(torchvision's ViT) and Hugging Face's ViT, DeiT, DINOv2 and CLIP vision attention. Explain this "
                "model with a CAM on its token layers (camkit.GradCAM(model)) or a gradient attribution."
            )
        found.append((name, module, kind))
        inside.append(name)
    if not found:
        raise InvalidInputError(
            f"{type(model).__name__} has no attention module camkit knows (timm's Attention, nn.MultiheadAttention, "
            "Hugging Face ViT / DeiT / DINOv2 / CLIP vision); attention methods explain vision transformers. For "
            "other models use a CAM (camkit.GradCAM) or a gradient attribution."
        )
    return found


def block_of(model: nn.Module, name: str) -> tuple[str, nn.Module]:
    """The transformer block holding the attention module ``name``: its ancestor held by a ModuleList or Sequential."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = model.get_submodule(".".join(parts[: cut - 1])) if cut > 1 else model
        if isinstance(parent, (nn.ModuleList, nn.Sequential)):
            block = ".".join(parts[:cut])
            return block, model.get_submodule(block)
    raise InvalidInputError(
        f"the attention module '{name}' is not inside a list of blocks (nn.ModuleList or nn.Sequential); LeGrad "
        "reads each block's output tokens. Pass layers= the block modules."
    )


def first_tensor(output: Any) -> Tensor | None:
    """A block's output tokens: the output itself, or the first item of a tuple or list."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


def _tokens_of(output: Any) -> Tensor:
    tokens = first_tensor(output)
    if tokens is None:
        raise InvalidInputError(f"a transformer block returned {type(output).__name__}; camkit reads tensors [B, N, D]")
    return tokens


class AttentionCapture:
    """Record the attention probabilities of every attention module during one forward.

    Args:
        model: the transformer (already unwrapped).
        gradients: keep the probabilities on the output's graph so that a score can be
            differentiated with respect to them. Autograd is off until the first attention layer,
            so no graph is recorded before it.
        blocks: with gradients, also record each block's output tokens [B, N, D] and cut the
            graph at each block's input: a score read from block ``l``'s output then depends on
            block ``l``'s attention only, and one backward of the sum of all blocks' scores gives
            each block's gradient of its own score (LeGrad).
        local: with gradients, each attention's probabilities become a fresh leaf and its queries, keys
            and values run without autograd (what ``blocks`` does inside a block), without the block hooks.
        reduce: with no gradients, what is kept of each layer's probabilities (e.g. its heads fused).

    Setting :attr:`live` to ``False`` makes the hooks record nothing and build no graph, and gives
    each attention module back its own (fused) implementation: the forward that only keeps the
    block inputs of a block-by-block explanation runs as the model's own forward does. Back to
    ``True``, the attention is unfused and recorded again.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        gradients: bool,
        blocks: bool = False,
        local: bool = False,
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.model = model
        self.gradients = gradients
        self.reduce = reduce
        self._live = True
        self._switches: list[Callable[[bool], None]] = []  # per module: unfused (True) or its own (False)
        # LeGrad differentiates each block's score with respect to that block's probabilities only, so
        # the queries, keys and values need no graph: they run without autograd, A is a fresh leaf.
        self._local = gradients and (blocks or local)
        self.blocks = blocks
        self.modules = attention_modules(model)
        self.probabilities: list[list[Tensor]] = [[] for _ in self.modules]
        self.outputs: list[list[Tensor]] = [[] for _ in self.modules]
        self._scope = HookScope()
        self._undo: list[Callable[[], None]] = []
        # autograd's mode: off from entry, switched by the hooks as the forward goes, the caller's back on exit
        self._grad_modes = GradModes()

    def __enter__(self) -> AttentionCapture:
        self._grad_modes = GradModes()
        try:
            for index, (name, module, kind) in enumerate(self.modules):
                getattr(self, f"_hook_{kind}")(index, module)
                if self.blocks:
                    self._hook_block(index, *block_of(self.model, name))
        except BaseException:
            self.__exit__()
            raise
        self._grad_modes.enter(False)
        return self

    def __exit__(self, *exc: object) -> None:
        self._scope.remove()
        while self._undo:
            self._undo.pop()()
        self._grad_modes.close()

    @property
    def live(self) -> bool:
        """Whether the hooks record (the attention unfused) or stand aside (the model's own attention)."""
        return self._live

    @live.setter
    def live(self, value: bool) -> None:
        self._live = value
        for switch in self._switches:
            switch(value)

    # --- per family ---------------------------------------------------------------------

    def _leaf(self, tensor: Tensor) -> Tensor:
        """``tensor`` itself when it is on a graph, else a leaf that requires grad; autograd is on from here."""
        self._grad_modes.enter(True)
        return tensor if tensor.requires_grad else tensor.detach().requires_grad_(True)

    def _record(self, index: int, attention: Tensor) -> Tensor:
        if self._local:
            self._grad_modes.enter(True)
            attention = attention.detach().requires_grad_(True)
            self.probabilities[index].append(attention)
        elif self.gradients:
            attention = self._leaf(attention)
            self.probabilities[index].append(attention)
        else:
            self._keep(index, attention)
        return attention

    def _keep(self, index: int, attention: Tensor) -> None:
        detached = attention.detach()
        self.probabilities[index].append(detached if self.reduce is None else self.reduce(detached))

    def _hook_timm(self, index: int, module: Any) -> None:
        fused = module.fused_attn
        self._undo.append(lambda: setattr(module, "fused_attn", fused))
        self._switches.append(lambda live: setattr(module, "fused_attn", False if live else fused))
        module.fused_attn = False

        def before_dropout(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            return (self._record(index, args[0]), *args[1:]) if self.live else None

        def no_graph(*_: Any) -> None:
            if self.live:
                self._grad_modes.enter(False)

        if self._local:
            self._scope.forward_pre(module, no_graph)
        self._scope.forward_pre(module.attn_drop, before_dropout)

    def _hook_hf(self, index: int, module: Any) -> None:
        config = module.config
        implementation = config._attn_implementation
        if implementation != "eager":
            self._undo.append(lambda: setattr(config, "_attn_implementation", implementation))
            self._switches.append(lambda live: setattr(config, "_attn_implementation", "eager" if live else implementation))
            config._attn_implementation = "eager"

        def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if not self.gradients or not self.live:
                return None
            if args and isinstance(args[0], Tensor):
                return (self._leaf(args[0]), *args[1:]), kwargs
            if isinstance(kwargs.get("hidden_states"), Tensor):
                return args, {**kwargs, "hidden_states": self._leaf(kwargs["hidden_states"])}
            return None

        def after(_: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not self.live:
                return
            weights = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            if not isinstance(weights, Tensor) or weights.dim() != 4:
                raise InvalidInputError(
                    f"{type(module).__name__} returned no attention probabilities [B, heads, N, N] with the eager "
                    "attention implementation; camkit reads Hugging Face attention modules that return "
                    "(output, weights), as transformers 5 does"
                )
            if self.gradients and not weights.requires_grad:
                raise InvalidInputError(f"{type(module).__name__}'s attention probabilities are not on its output's graph")
            if self.gradients:
                self.probabilities[index].append(weights)
            else:
                self._keep(index, weights)

        self._scope.forward_pre(module, before, with_kwargs=True)
        self._scope.forward(module, after, own_thread=True)

    def _hook_mha(self, index: int, module: Any) -> None:
        if mha_unreadable(module) is not None:
            raise InvalidInputError(
                "camkit reads nn.MultiheadAttention with batch_first=True, one packed input projection and no added "
                "key/value biases (as torchvision's ViT builds it)"
            )
        # the module's forward is replaced for the block (an instance attribute, removed after): while live it
        # computes the probabilities itself, so that they are the very tensor its output is mixed from
        own, original = module.__dict__.get("forward"), module.forward
        self._undo.append(lambda: module.__dict__.pop("forward", None) if own is None else setattr(module, "forward", own))

        def forward(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
            if not self.live:  # the module's own call, fused where it can be
                return cast(tuple[Tensor, Tensor | None], original(*args, **kwargs))
            if len(args) > 3:
                raise InvalidInputError("camkit reads nn.MultiheadAttention called with keyword options after (x, x, x)")
            query, key, value = (*args, *(kwargs.pop(name, None) for name in ("query", "key", "value")[len(args) :]))
            if not (query is key and key is value) or not isinstance(query, Tensor):
                raise InvalidInputError("camkit reads self-attention: nn.MultiheadAttention called as attn(x, x, x)")
            need, average = bool(kwargs.pop("need_weights", True)), bool(kwargs.pop("average_attn_weights", True))
            if self._local:
                self._grad_modes.enter(False)
            elif self.gradients:
                query = self._leaf(query)
            masked = any(kwargs.get(name) is not None for name in ("key_padding_mask", "attn_mask")) or kwargs.get("is_causal")
            if masked or set(kwargs) - {"key_padding_mask", "attn_mask", "is_causal"} or (module.training and module.dropout > 0):
                # masks, dropout or an option this path does not know: the module's own unfused path, whose
                # weights come after its output; with gradients the output is mixed again from them
                out, attention = original(query, query, query, **kwargs, need_weights=True, average_attn_weights=False)
                values = None
            else:
                attention, values = _probabilities(module, query)
            if self.gradients:
                attention = self._record(index, attention)
                out = mha_output(module, attention, values if values is not None else _values(module, query, not self._local))
            else:
                self._keep(index, attention)
                if values is not None:
                    out = mha_output(module, attention, values)
            return out, ((attention.mean(dim=1) if average else attention) if need else None)

        module.forward = forward

    def _hook_block(self, index: int, name: str, block: nn.Module) -> None:
        def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if args and isinstance(args[0], Tensor):
                return (args[0].detach(), *args[1:]), kwargs
            if isinstance(kwargs.get("hidden_states"), Tensor):
                return args, {**kwargs, "hidden_states": kwargs["hidden_states"].detach()}
            return None

        def after(_: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self.outputs[index].append(_tokens_of(output))

        self._scope.forward_pre(block, before, with_kwargs=True)
        self._scope.forward(block, after, own_thread=True)

    # --- after the forward ----------------------------------------------------------------

    def attentions(self) -> list[Tensor]:
        """Each attention module's probabilities [B, heads, N, N], in the order the modules are registered."""
        return self._once(self.probabilities, "attention module")

    def take(self, index: int) -> Tensor:
        """The probabilities attention module ``index`` recorded since the last ``take`` (exactly one call)."""
        got, self.probabilities[index] = self.probabilities[index], []
        if len(got) != 1:
            raise LayerNotReachedError(
                f"the attention module '{self.modules[index][0]}' ran {len(got)} times in one call of its block; "
                "attention methods read each layer once per forward"
            )
        return got[0]

    def block_outputs(self) -> list[Tensor]:
        """Each block's output tokens [B, N, D] (``blocks=True`` only)."""
        return self._once(self.outputs, "block")

    def _once(self, records: list[list[Tensor]], what: str) -> list[Tensor]:
        out = []
        for (name, _, _), got in zip(self.modules, records):
            if len(got) != 1:
                raise LayerNotReachedError(
                    f"the {what} of '{name}' ran {len(got)} times in one forward; attention methods read each "
                    "layer once per forward"
                )
            out.append(got[0])
        return out


def _probabilities(module: Any, x: Tensor) -> tuple[Tensor, Tensor]:
    """An ``nn.MultiheadAttention``'s probabilities ``A`` [B, heads, N, N] and values [B, heads, N, d] over ``x`` [B, N, D].

    The packed projection once, then ``softmax(q k^T / sqrt(d))``, as its own unfused path computes them.
    """
    batch, tokens, dim = x.shape
    heads = module.num_heads
    qkv = F.linear(x, module.in_proj_weight, module.in_proj_bias).view(batch, tokens, 3, heads, dim // heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return torch.softmax((q * (dim // heads) ** -0.5) @ k.transpose(-2, -1), dim=-1), v


def _values(module: Any, x: Tensor, grad: bool) -> Tensor:
    """:func:`mha_values`, on the graph only with ``grad`` (and autograd on)."""
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        return mha_values(module, x)


def mha_unreadable(module: nn.MultiheadAttention) -> str | None:
    """Why ``module``'s attention cannot be computed from its own packed projection; ``None`` when it can.

    ``"batch_first"`` (it is not batch-first), ``"projection"`` (keys or values of other sizes: no one
    ``in_proj_weight``) or ``"added_tokens"`` (``add_bias_kv`` or ``add_zero_attn``), the first that applies.
    """
    if not module.batch_first:
        return "batch_first"
    if module.kdim != module.embed_dim or module.vdim != module.embed_dim or module.in_proj_weight is None:
        return "projection"
    if module.bias_k is not None or module.bias_v is not None or module.add_zero_attn:
        return "added_tokens"
    return None


def mha_values(module: Any, x: Tensor) -> Tensor:
    """An ``nn.MultiheadAttention``'s values [B, heads, N, d] over ``x`` [B, N, D], from its own packed projection."""
    batch, tokens, dim = x.shape
    weight, bias = module.in_proj_weight[2 * dim :], None if module.in_proj_bias is None else module.in_proj_bias[2 * dim :]
    return F.linear(x, weight, bias).view(batch, tokens, module.num_heads, dim // module.num_heads).transpose(1, 2)


def mha_output(module: Any, attention: Tensor, values: Tensor) -> Tensor:
    """``out_proj(A @ V)`` of an ``nn.MultiheadAttention``: its output [B, N, D] mixed from ``attention``
    [B, heads, N, N] and ``values`` [B, heads, N, d]."""
    batch, heads, _, dim = values.shape
    mixed = (attention.to(values.dtype) @ values).transpose(1, 2).reshape(batch, attention.shape[2], heads * dim)
    return cast(Tensor, module.out_proj(mixed))
