"""Default layers of Hugging Face transformers' vision families, recognised by class name and config.

transformers is never imported: a model is matched by its class (or a base class) and the
rule's layer pattern.

The video families (VideoMAE, TimeSformer, ViViT) take ``pixel_values`` ``[B, T, C, H, W]``:
they are explained through :class:`camkit.layers.video.ChannelsFirstVideo`, and their token
grid comes from their configuration (:class:`~camkit.layers.families.rule.TokenLayout`), read
from the installed source (transformers 5): VideoMAE's and ViViT's tubelet tokens run frame
by frame, row by row (time-major, the order a ``Conv3d`` flattens); TimeSformer's run patch by
patch, each patch's frames in a row (its embeddings permute ``[B, T, N, D]`` to ``[B, N, T, D]``,
and every divided space-time layer keeps that order), after one class token.
"""

from __future__ import annotations

from torch import nn

from .rule import NCHW, FamilyRule, TokenLayout, tokens

__all__ = ["RULES"]

_HF = "transformers"


def _dinov2_prefix(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    registers = getattr(config, "num_register_tokens", 0) or 0
    return 1 + int(registers) if isinstance(registers, int) else None


def _pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def _videomae_layout(model: nn.Module) -> TokenLayout | None:
    config = getattr(model, "config", None)
    tubelet, patch = getattr(config, "tubelet_size", None), _pair(getattr(config, "patch_size", None))
    if not isinstance(tubelet, int) or patch is None:
        return None
    return TokenLayout(prefix=0, strides=(tubelet, *patch))


def _vivit_layout(model: nn.Module) -> TokenLayout | None:
    tubelet = getattr(getattr(model, "config", None), "tubelet_size", None)
    if not (isinstance(tubelet, (list, tuple)) and len(tubelet) == 3 and all(isinstance(t, int) for t in tubelet)):
        return None
    return TokenLayout(prefix=1, strides=tuple(int(t) for t in tubelet))


def _timesformer_layout(model: nn.Module) -> TokenLayout | None:
    config = getattr(model, "config", None)
    patch = _pair(getattr(config, "patch_size", None))
    if patch is None or getattr(config, "attention_type", None) not in ("divided_space_time", "joint_space_time"):
        return None  # "space_only" runs every frame as its own batch row: no [B, N, D] tokens of the clip
    return TokenLayout(prefix=1, strides=(1, *patch), order=(1, 2, 0))


_VIDEO_TOKENS = "tokens [B, {}t·h·w, D]"

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
               ("vision_model.encoder.layers.<last>.layer_norm1", "encoder.layers.<last>.layer_norm1"), tokens("1 + "),
               "CLIPForImageClassification, CLIPVisionModel", None, 1),
    FamilyRule(_HF, "DINOv2", ("Dinov2ForImageClassification", "Dinov2Model",
                               "Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersModel"),
               ("dinov2.encoder.layer.<last>.norm1", "dinov2_with_registers.encoder.layer.<last>.norm1",
                "encoder.layer.<last>.norm1"),
               tokens("1 + registers + "), "Dinov2ForImageClassification, Dinov2WithRegisters*", None,
               _dinov2_prefix),
    FamilyRule(_HF, "VideoMAE", ("VideoMAEForVideoClassification", "VideoMAEModel"),
               ("videomae.encoder.layer.<last>.layernorm_before", "encoder.layer.<last>.layernorm_before"),
               _VIDEO_TOKENS.format("") + " (frames first: wrap in ChannelsFirstVideo)",
               "VideoMAEForVideoClassification, VideoMAEModel", None, 0, _videomae_layout, True),
    # divided space-time attention: the last layer's norms see frames or patch tubes as batch
    # rows, and its output is a tuple; temporal_dense is the last output holding every patch
    # token of the clip at the batch's size that feeds the class token
    FamilyRule(_HF, "TimeSformer", ("TimesformerForVideoClassification", "TimesformerModel"),
               ("timesformer.encoder.layer.<last>.temporal_dense", "encoder.layer.<last>.temporal_dense",
                "timesformer.encoder.layer.<last>.layernorm_before", "encoder.layer.<last>.layernorm_before"),
               "tokens [B, h·w·t, D], patch-major (frames first: wrap in ChannelsFirstVideo)",
               "TimesformerForVideoClassification, TimesformerModel", None, 0, _timesformer_layout, True),
    FamilyRule(_HF, "ViViT", ("VivitForVideoClassification", "VivitModel"),
               ("vivit.layers.<last>.layernorm_before", "layers.<last>.layernorm_before",  # transformers 5
                "vivit.encoder.layer.<last>.layernorm_before", "encoder.layer.<last>.layernorm_before"),  # 4.x
               _VIDEO_TOKENS.format("1 + ") + " (frames first: wrap in ChannelsFirstVideo)",
               "VivitForVideoClassification, VivitModel", None, 1, _vivit_layout, True),
    # detection and segmentation: DETR's backbone's last stage (a Hugging Face ResNet backbone,
    # or a timm one), before the projection to the transformer; SegFormer's decoder features
    # (all stages fused at a quarter of the input's size), before the 1x1 classifier
    FamilyRule(_HF, "DETR", ("DetrForObjectDetection", "DetrForSegmentation", "DetrModel"),
               tuple(f"{root}backbone.{mid}model.{stage}"
                     for stage in ("encoder.stages.<last>", "layer4")
                     for mid in ("", "conv_encoder.")
                     for root in ("model.", "detr.model.", "")),
               NCHW + " (stride 32)", "DetrForObjectDetection, DetrModel", False),
    FamilyRule(_HF, "SegFormer", ("SegformerForSemanticSegmentation",),
               ("decode_head.batch_norm",), NCHW + " (a quarter of the input's size)",
               "SegformerForSemanticSegmentation", False),
)
