"""A tiny PaliGemma (SigLIP vision tower, Gemma language model) and its processor, built from code."""

from __future__ import annotations

import torch
from tiny_words import word_tokenizer

IMAGE = "<image>"


def processor(*, size: int = 32, patch: int = 8):
    from transformers import PaliGemmaProcessor, SiglipImageProcessor

    tokenizer = word_tokenizer([IMAGE], image_token=IMAGE)
    tokenizer.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE)
    image_processor = SiglipImageProcessor(size={"height": size, "width": size})
    image_processor.image_seq_length = (size // patch) ** 2
    return PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)


def build(dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa", *, seed: int = 0, size: int = 32, patch: int = 8):
    """``(model, processor)``: random weights (seeded), eval mode, ``dtype`` and the attention implementation asked."""
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipVisionConfig

    hidden = 32
    vision = SiglipVisionConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2,
        image_size=size, patch_size=patch, vision_use_head=False,
    )
    text = GemmaConfig(
        vocab_size=1280, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    config = PaliGemmaConfig(vision_config=vision, text_config=text, image_token_id=4, projection_dim=hidden)
    torch.manual_seed(seed)
    model = PaliGemmaForConditionalGeneration(config)
    model.generation_config.pad_token_id = 0
    model = model.to(dtype).eval()
    model.set_attn_implementation(attn_implementation)
    return model, processor(size=size, patch=patch)
