"""Tiny vision transformers of every family camkit's attention methods read, and a hand reference.

:func:`hand_forward` runs a model with every attention computed here by hand from the module's
own query and key weights (``softmax(q k^T * scale)``, unfused) and its output rebuilt from those
probabilities, so that the tests' formulas see probabilities and gradients that camkit's capture
did not produce.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

SIZE = 32


def assert_maps_close(new: Tensor, old: Tensor, raw: Tensor, atol: float) -> None:
    """``new`` and ``old`` maps [B, ..., H, W] equal within ``atol``, or within float32 rounding of ``raw`` [B, ..., h, w].

    Min-max normalisation divides by each raw map's range: where that range is only a few float32
    steps of the map's level (a mean query on a random tiny model spans ~1e-5 around 1/N), the same
    sums taken in another order move the normalised map by those steps over the range.
    """
    level = raw.abs().flatten(-2).amax(-1)
    span = (raw.flatten(-2).amax(-1) - raw.flatten(-2).amin(-1)).clamp_min(1e-30)
    rounding = 8 * torch.finfo(torch.float32).eps * level / span
    diff = (new - old).abs().flatten(-2).amax(-1)
    assert (diff <= rounding.clamp_min(atol)).all(), (diff, rounding)


def timm_vit(reg_tokens: int = 0, global_pool: str = "token", class_token: bool = True, seed: int = 0) -> nn.Module:
    import timm

    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=SIZE, patch_size=8, embed_dim=16, depth=3, num_heads=2,
        num_classes=4, reg_tokens=reg_tokens, global_pool=global_pool, class_token=class_token,
    ).eval()


def torchvision_vit(seed: int = 0) -> nn.Module:
    from torchvision.models import VisionTransformer

    torch.manual_seed(seed)
    model = VisionTransformer(image_size=SIZE, patch_size=8, num_layers=3, num_heads=2, hidden_dim=16, mlp_dim=32,
                              num_classes=4)
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts the head at zero
    return model.eval()


def hf_vit(family: str = "vit", seed: int = 0) -> nn.Module:
    import transformers as hf

    torch.manual_seed(seed)
    common = dict(image_size=SIZE, patch_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=2)
    if family == "vit":
        return hf.ViTForImageClassification(hf.ViTConfig(**common, intermediate_size=32, num_labels=4)).eval()
    if family == "deit":
        return hf.DeiTForImageClassificationWithTeacher(hf.DeiTConfig(**common, intermediate_size=32, num_labels=4)).eval()
    if family == "dinov2":
        config = hf.Dinov2WithRegistersConfig(**common, mlp_ratio=2, num_labels=4, num_register_tokens=2)
        return hf.Dinov2WithRegistersForImageClassification(config).eval()
    if family == "clip":
        config = hf.CLIPVisionConfig(**common, intermediate_size=32, projection_dim=8)
        return hf.CLIPVisionModelWithProjection(config).eval()
    raise ValueError(family)


def _softmax(q: Tensor, k: Tensor, scale: float) -> Tensor:
    return ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)


def _heads(t: Tensor, heads: int) -> Tensor:
    b, n, d = t.shape
    return t.view(b, n, heads, d // heads).transpose(1, 2)


def _merge(t: Tensor) -> Tensor:
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    found = []
    for module in model.modules():
        if isinstance(module, nn.MultiheadAttention) or (
            type(module).__name__ in ("Attention", "ViTAttention", "DeiTAttention", "Dinov2WithRegistersAttention",
                                      "CLIPAttention")
        ):
            found.append(module)
    return found


def hand_forward(model: nn.Module, x: Tensor, blocks: list[nn.Module] | None = None):
    """``(output, attentions, block_outputs)``: attentions [B, H, N, N] computed by hand, on the graph."""
    attentions: list[Tensor] = []
    outputs: list[Tensor] = []
    handles = []

    def attend(module: nn.Module, args, kwargs, output):
        h = args[0] if args else kwargs["hidden_states"]
        if isinstance(module, nn.MultiheadAttention):
            q, k, v = F.linear(h, module.in_proj_weight, module.in_proj_bias).chunk(3, dim=-1)
            heads = module.num_heads
            q, k, v = _heads(q, heads), _heads(k, heads), _heads(v, heads)
            a = _softmax(q, k, 1 / math.sqrt(q.shape[-1]))
            attentions.append(a)
            return module.out_proj(_merge(a @ v)), None
        if hasattr(module, "qkv"):  # timm
            b, n, _ = h.shape
            q, k, v = module.qkv(h).reshape(b, n, 3, module.num_heads, module.head_dim).permute(2, 0, 3, 1, 4)
            a = _softmax(q, k, module.scale)
            attentions.append(a)
            return module.proj(_merge(a @ v))
        heads = getattr(module, "num_attention_heads", None) or module.num_heads
        q, k, v = (_heads(p(h), heads) for p in (module.q_proj, module.k_proj, module.v_proj))
        a = _softmax(q, k, getattr(module, "scaling", None) or module.scale)
        attentions.append(a)
        out = getattr(module, "o_proj", None) or module.out_proj
        return out(_merge(a @ v)), a

    for module in _attention_modules(model):
        handles.append(module.register_forward_hook(attend, with_kwargs=True))
    for block in blocks or []:
        handles.append(block.register_forward_hook(
            lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o)))
    try:
        with torch.enable_grad():
            output = model(x)
    finally:
        for handle in handles:
            handle.remove()
    return output, attentions, outputs


def blocks_of(model: nn.Module) -> list[nn.Module]:
    for path in ("blocks", "encoder.layers", "vit.layers", "deit.layers", "dinov2_with_registers.encoder.layer",
                 "vision_model.encoder.layers", "vit.encoder.layer", "deit.encoder.layer"):
        try:
            return list(model.get_submodule(path))
        except AttributeError:
            continue
    raise AttributeError(type(model).__name__)


def logits(output) -> Tensor:
    if isinstance(output, Tensor):
        return output
    return output.logits if hasattr(output, "logits") else output.image_embeds


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held at once by the tensors made inside the block (forward and backward alike).

    Each op's outputs are counted once per storage, until that storage is freed: the CPU's stand-in for
    CUDA's ``max_memory_allocated``, without the memory of tensors made before the block.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._held: set[int] = set()

    def _freed(self, key: int, size: int) -> None:
        self.live -= size
        self._held.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, Tensor):
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self._held:
                continue
            self._held.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, size)
        return out
