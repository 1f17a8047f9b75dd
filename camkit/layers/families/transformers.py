"""Default layers of Hugging Face transformers' vision families, recognised by class name and config.

transformers is never imported: a model is matched by its class (or a base class) and the
rule's layer pattern.
"""

from __future__ import annotations

from torch import nn

from .rule import NCHW, FamilyRule, tokens

__all__ = ["RULES"]

_HF = "transformers"


def _dinov2_prefix(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    registers = getattr(config, "num_register_tokens", 0) or 0
    return 1 + int(registers) if isinstance(registers, int) else None


RULES: tuple[FamilyRule, ...] = (
    FamilyRule(_HF, "ViT", ("ViTForImageClassification", "ViTModel"),
               ("vit.layers.<last>.layernorm_before", "layers.<last>.layernorm_before",  # transformers 5
                "vit.encoder.layer.<last>.layernorm_before", "encoder.layer.<last>.layernorm_before"),  # 4.x
               tokens("1 + "), "ViTForImageClassification, ViTModel", None, 1),
    FamilyRule(_HF, "DeiT", ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher", "DeiTModel"),
               ("deit.layers.<last>.layernorm_before", "layers.<last>.layernorm_before",  # transformers 5
                "deit.encoder.layer.<last>.layernorm_before", "encoder.layer.<last>.layernorm_before"),  # 4.x
               tokens("2 + "), "DeiTForImageClassification(WithTeacher), DeiTModel", None, 2),
    FamilyRule(_HF, "Swin", ("SwinForImageClassification", "SwinModel"),
               ("swin.encoder.layers.<last>.blocks.<last>.layernorm_before",
                "encoder.layers.<last>.blocks.<last>.layernorm_before"),
               "tokens [B, h·w, C] on the last stage's grid", "SwinForImageClassification, SwinModel", None, 0),
    FamilyRule(_HF, "ConvNeXt", ("ConvNextForImageClassification", "ConvNextModel"),
               ("convnext.encoder.stages.<last>", "encoder.stages.<last>"),
               NCHW + " (the stage ends with a Linear)", "ConvNextForImageClassification, ConvNextModel", False),
    FamilyRule(_HF, "ResNet", ("ResNetForImageClassification", "ResNetModel"),
               ("resnet.encoder.stages.<last>", "encoder.stages.<last>"), NCHW,
               "ResNetForImageClassification, ResNetModel", False),
    FamilyRule(_HF, "CLIP vision", ("CLIPForImageClassification", "CLIPVisionModel", "CLIPVisionModelWithProjection"),
               ("vision_model.encoder.layers.<last>.layer_norm1",), tokens("1 + "),
               "CLIPForImageClassification, CLIPVisionModel", None, 1),
    FamilyRule(_HF, "DINOv2", ("Dinov2ForImageClassification", "Dinov2Model",
                               "Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersModel"),
               ("dinov2.encoder.layer.<last>.norm1", "dinov2_with_registers.encoder.layer.<last>.norm1",
                "encoder.layer.<last>.norm1"),
               tokens("1 + registers + "), "Dinov2ForImageClassification, Dinov2WithRegisters*", None,
               _dinov2_prefix),
)
