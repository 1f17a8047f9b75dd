"""A tiny SmolVLM (Idefics3's image splitting with a 4 x 4 pixel shuffle) and its processor."""

from __future__ import annotations

import torch
from tiny_idefics3 import parts

#: 32-pixel views of 2-pixel patches, 4 x 4 patches shuffled into one token: 4 x 4 tokens per view
VIEW, PATCH, SCALE = 32, 2, 4


def build(dtype=torch.float32, attn_implementation="sdpa"):
    """``(model, processor)``: a seeded random SmolVLM."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    tok, processor, text, vision = parts(SmolVLMProcessor, SmolVLMImageProcessor, view=VIEW, patch=PATCH,
                                         scale=SCALE, video_processor=SmolVLMVideoProcessor())
    config = SmolVLMConfig(text_config={"model_type": "llama", **text}, vision_config=vision, scale_factor=SCALE,
                           image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id)
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = SmolVLMForConditionalGeneration(config).to(dtype).eval()
    return model, processor
