"""Default layers of timm's model families, recognised by class name (timm is never imported)."""

from __future__ import annotations

from .rule import NCHW, NHWC, FamilyRule, tokens

__all__ = ["RULES"]

_TIMM = "timm"

RULES: tuple[FamilyRule, ...] = (
    FamilyRule(_TIMM, "ResNet / ResNet-D / ResNeXt / SE-ResNet", ("ResNet",), ("layer4",), NCHW,
               "resnet18, resnet10t, resnet50d, resnext50_32x4d", False),
    FamilyRule(_TIMM, "EfficientNet / MixNet / MNASNet", ("EfficientNet",), ("bn2",), NCHW,
               "efficientnet_b0, tf_efficientnetv2_b0", False),
    FamilyRule(_TIMM, "MobileNetV3", ("MobileNetV3",), ("blocks.<last>",), NCHW + " (before the pooled conv_head)",
               "mobilenetv3_small_050, mobilenetv3_large_100", False),
    FamilyRule(_TIMM, "ConvNeXt", ("ConvNeXt",), ("stages.<last>.blocks.<last>",), NCHW,
               "convnext_atto, convnext_tiny", False),
    FamilyRule(_TIMM, "RegNet", ("RegNet",), ("s4",), NCHW, "regnetx_002, regnety_004", False),
    FamilyRule(_TIMM, "DenseNet", ("DenseNet",), ("features",), NCHW + " (ends with norm5)", "densenet121", False),
    FamilyRule(_TIMM, "VGG", ("VGG",), ("features.<last ReLU>",), NCHW + " (before the last max-pool)",
               "vgg11, vgg16_bn", False),
    FamilyRule(_TIMM, "Inception v3", ("InceptionV3",), ("Mixed_7c",), NCHW, "inception_v3", False),
    FamilyRule(_TIMM, "Xception (legacy)", ("Xception",), ("act4",), NCHW, "legacy_xception", False),
    FamilyRule(_TIMM, "Xception (aligned)", ("XceptionAligned",), ("act",), NCHW, "xception41, xception65p", False),
    FamilyRule(_TIMM, "ViT / DeiT / EVA / BEiT", ("VisionTransformer", "Eva", "Beit"), ("blocks.<last>.norm1",),
               tokens("prefix + "), "vit_tiny_patch16_224, deit_tiny_distilled_patch16_224, eva02_tiny_patch14_224, "
               "beit_base_patch16_224"),
    FamilyRule(_TIMM, "Swin", ("SwinTransformer",), ("layers.<last>.blocks.<last>.norm1",), NHWC,
               "swin_tiny_patch4_window7_224", True),
    # Swin V2 normalises after attention (norm1 is on the residual branch): the block's output
    FamilyRule(_TIMM, "Swin V2", ("SwinTransformerV2",), ("layers.<last>.blocks.<last>",), NHWC,
               "swinv2_tiny_window8_256", True),
    FamilyRule(_TIMM, "LeViT", ("Levit", "LevitDistilled"), ("stages.<last>",),
               tokens("") + " (levit_conv_*: [B, C, h, w])", "levit_128s, levit_conv_128s", None, 0),
    FamilyRule(_TIMM, "MLP-Mixer / ResMLP", ("MlpMixer",), ("blocks.<last>",), tokens(""),
               "mixer_s16_224, resmlp_12_224", None, 0),
    FamilyRule(_TIMM, "CoAtNet / MaxViT", ("MaxxVit",), ("stages.<last>",), NCHW + " (the stage ends with a Linear)",
               "coatnet_nano_rw_224, maxvit_nano_rw_256", False),
    FamilyRule(_TIMM, "EfficientFormer", ("EfficientFormer",), ("stages.<last>",), tokens(""),
               "efficientformer_l1", None, 0),
    FamilyRule(_TIMM, "MobileViT / BYOB nets", ("ByobNet",), ("final_conv",), NCHW,
               "mobilevit_xxs, resnext26ts, repvgg_a0", False),
)
