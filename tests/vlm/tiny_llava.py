"""A tiny LLaVA 1.5 (CLIP vision tower, Llama language model) and its processor, built from code."""

from __future__ import annotations

import torch
from tiny_words import word_tokenizer

IMAGE = "<image>"
CHAT = (
    "{% for message in messages %}{{ message['role'].upper() }}: "
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image> {% else %}{{ part['text'] }} {% endif %}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}ASSISTANT :{% endif %}"
)


def processor(*, crop: int = 32, patch: int = 8, chat_template: str | None = CHAT, **image_options):
    from transformers import LlavaImageProcessor, LlavaProcessor

    tokenizer = word_tokenizer([IMAGE], image_token=IMAGE)
    image_processor = LlavaImageProcessor(
        size={"shortest_edge": crop}, crop_size={"height": crop, "width": crop}, **image_options
    )
    return LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, chat_template=chat_template,
    )


def config(*, crop: int = 32, patch: int = 8, layers: int = 2, hidden: int = 32, feature_layer: int = -2, vocab: int = 64):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3, num_attention_heads=2,
        image_size=crop, patch_size=patch, projection_dim=hidden,
    )
    text = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
    )
    return LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=4, vision_feature_layer=feature_layer,
        vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )


def build(dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa", *, seed: int = 0, **sizes):
    """``(model, processor)``: random weights (seeded), eval mode, ``dtype`` and the attention implementation asked."""
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config(**sizes))
    model.generation_config.pad_token_id = 0
    model = model.to(dtype).eval()
    model.set_attn_implementation(attn_implementation)
    return model, processor(crop=sizes.get("crop", 32), patch=sizes.get("patch", 8))
