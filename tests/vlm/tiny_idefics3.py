"""A tiny Idefics3 (image splitting into crops plus the global image, pixel shuffle) and its processor."""

from __future__ import annotations

import torch
from tiny_family_tokens import chat_template, word_tokenizer

#: each view is VIEW x VIEW pixels, PATCH-pixel patches, SCALE x SCALE patches shuffled into one token
VIEW, PATCH, SCALE = 32, 4, 2
#: the longest edge is first resized to this, so an image becomes at most 2 x 2 crops plus the global view
LONGEST = 2 * VIEW
SPECIAL = ["<|begin_of_text|>", "<end_of_utterance>", "<|end_of_text|>", "<fake_token_around_image>", "<image>",
           "<global-img>"] + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
TEMPLATE = chat_template(bos="<|begin_of_text|>", turn_start="{role}:", turn_end="<end_of_utterance>\n",
                         image="<image>", assistant="assistant:")


def seq_len(view=VIEW, patch=PATCH, scale=SCALE):
    return (view // patch // scale) ** 2


def parts(processor_cls, image_processor_cls, *, view, patch, scale, **extra):
    tok = word_tokenizer(SPECIAL, eos="<end_of_utterance>", pad="<|end_of_text|>", bos="<|begin_of_text|>")
    image = image_processor_cls(size={"longest_edge": 2 * view}, max_image_size={"longest_edge": view},
                                resample=2)  # bilinear: LANCZOS rings across crop borders
    processor = processor_cls(image_processor=image, tokenizer=tok, image_seq_len=seq_len(view, patch, scale),
                              chat_template=TEMPLATE, **extra)
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=view,
                  patch_size=patch)
    return tok, processor, text, vision


def build(dtype=torch.float32, attn_implementation="sdpa"):
    """``(model, processor)``: a seeded random Idefics3 with 32-pixel views of 4 x 4 tokens."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor

    tok, processor, text, vision = parts(Idefics3Processor, Idefics3ImageProcessor, view=VIEW, patch=PATCH,
                                         scale=SCALE)
    config = Idefics3Config(text_config={"model_type": "llama", **text}, vision_config=vision, scale_factor=SCALE,
                            image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id)
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config).to(dtype).eval()
    return model, processor
