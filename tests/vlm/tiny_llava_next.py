"""A tiny LLaVA-NeXT (any-resolution tiles) and its processor, built from code."""

from __future__ import annotations

import tiny_llava
import torch
from tiny_words import word_tokenizer

PINPOINTS = [[32, 64], [64, 32], [64, 64]]


def processor(*, crop: int = 32, patch: int = 8):
    from transformers import LlavaNextImageProcessor, LlavaNextProcessor

    tokenizer = word_tokenizer([tiny_llava.IMAGE], image_token=tiny_llava.IMAGE)
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": crop}, crop_size={"height": crop, "width": crop}, image_grid_pinpoints=PINPOINTS,
    )
    return LlavaNextProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, chat_template=tiny_llava.CHAT,
    )


def build(dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa", *, seed: int = 0):
    """``(model, processor)``: random weights (seeded), eval mode, ``dtype`` and the attention implementation asked."""
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

    base = tiny_llava.config()
    config = LlavaNextConfig(
        vision_config=base.vision_config.to_dict(), text_config=base.text_config.to_dict(), image_token_id=4,
        vision_feature_layer=-2, vision_feature_select_strategy="default", image_grid_pinpoints=PINPOINTS,
    )
    config.vision_config.model_type, config.text_config.model_type = "clip_vision_model", "llama"
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(config)
    model.generation_config.pad_token_id = 0
    model = model.to(dtype).eval()
    model.set_attn_implementation(attn_implementation)
    return model, processor()
