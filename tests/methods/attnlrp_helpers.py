"""The anchor of AttnLRP's parity tests: LXT 2.1's efficient rules on torchvision's ViT, and tiny models of each family.

LXT patches classes (``nn.GELU``, ``nn.LayerNorm``, ``nn.MultiheadAttention`` and zennit's
``BasicHook``) for the whole process; :func:`lxt_relevance` puts every patched attribute back
before it returns, so that no other test runs on a patched torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

_PATCHED = (nn.GELU, nn.LayerNorm, nn.MultiheadAttention)


@contextmanager
def _lxt_modules() -> Iterator[types.SimpleNamespace]:
    """LXT's efficient rules, patches and ViT map, loaded without ``lxt.efficient``'s ``__init__``.

    ``import lxt.efficient`` imports its BERT patches, which import
    ``transformers.modeling_attn_mask_utils`` (and other names) that transformers 5 no longer has; the
    ViT parity needs none of them. Stand-in packages for ``lxt.efficient`` and ``lxt.efficient.models``
    (empty modules whose ``__path__`` is the real folder) let Python load the needed files by their
    real names; they are taken out of ``sys.modules`` again afterwards.
    """
    import lxt

    root = Path(lxt.__file__).parent / "efficient"
    before = set(sys.modules)
    for name, path in (("lxt.efficient", root), ("lxt.efficient.models", root / "models")):
        stand_in = types.ModuleType(name)
        stand_in.__path__ = [str(path)]
        sys.modules[name] = stand_in
    try:
        yield types.SimpleNamespace(
            zennit_patches=importlib.import_module("lxt.efficient.zennit_patches"),
            vit=importlib.import_module("lxt.efficient.models.vit_torch"),
        )
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("lxt.efficient"):
                del sys.modules[name]


@contextmanager
def _restored_classes() -> Iterator[None]:
    from zennit.core import BasicHook

    classes = (*_PATCHED, BasicHook)
    saved = [(cls, dict(vars(cls))) for cls in classes]
    try:
        yield
    finally:
        for cls, attributes in saved:
            for name in set(vars(cls)) - set(attributes):
                delattr(cls, name)
            for name in ("forward", "backward", "original_forward"):
                if name in attributes:
                    setattr(cls, name, attributes[name])


def lxt_relevance(model: nn.Module, x: Tensor, target: int, *, conv_gamma: float, gamma: float,
                  attention: str = "cp", stabilizer: float = 1e-6) -> Tensor:  # fmt: skip
    """LXT's ViT recipe: its ``cp_LRP`` patches (or, for ``attention="attnlrp"``, the same with its uniform
    rule on the attention's query, key and value), zennit's generalised gamma on convolutions and
    linear layers, and gradient x input at ``x`` [B, C, H, W] for class ``target``.
    """
    from torchvision.models import vision_transformer
    from zennit.composites import LayerMapComposite
    from zennit.rules import Gamma

    with _restored_classes(), _lxt_modules() as lxt:
        patch_map = dict(lxt.vit.cp_LRP)
        if attention == "attnlrp":
            patches = sys.modules["lxt.efficient.patches"]
            patch_map[nn.MultiheadAttention] = lambda cls: patches.patch_method(
                _uniform_mha(patches), cls, keep_original=True
            )
        for cls, patch in patch_map.items():
            patch(cls)
        lxt.zennit_patches.monkey_patch_zennit()
        composite = LayerMapComposite(
            [(nn.Conv2d, Gamma(conv_gamma, stabilizer)), (nn.Linear, Gamma(gamma, stabilizer))]
        )
        leaf = x.detach().clone().requires_grad_(True)
        with composite.context(model):
            out = model(leaf)
            (grad,) = torch.autograd.grad(out[:, target].sum(), leaf)
    assert "original_forward" not in vars(vision_transformer.nn.GELU)
    return leaf.detach() * grad


def _uniform_mha(patches: types.ModuleType):
    """LXT's AttnLRP attention wrapper for ``nn.MultiheadAttention``: query and key gradients / 4, value / 2.

    LXT ships it for Hugging Face's attention functions (``wrap_attention_forward``); torchvision's
    attention takes the same inputs, so the same division applies to it.
    """
    divide = sys.modules["lxt.efficient.rules"].divide_gradient

    def forward(self, query, key, value, *args, **kwargs):
        return self.original_forward(divide(query, 4), divide(key, 4), divide(value, 2), *args, **kwargs)

    return forward


def torchvision_vit(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """torchvision's ViT (vit_b_16's architecture), tiny: 32 x 32 images, patches of 8, 2 blocks of width 16."""
    from torchvision.models import VisionTransformer

    torch.manual_seed(seed)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                              num_classes=4)  # fmt: skip
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts the head at zero
    for name, param in model.named_parameters():  # torchvision starts biases, class token and norms at constants
        if "bias" in name or "class_token" in name:
            nn.init.normal_(param, std=0.1)
    return model.to(dtype).eval()
