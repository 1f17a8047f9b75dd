"""A tiny Qwen2-VL (dynamic resolution, 2x2 merged patches) and its processor, built from code."""

from __future__ import annotations

import torch
from tiny_family_tokens import chat_template, word_tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH, MERGE = 4, 2
#: the processor resizes every image to between 4 and 48 merged tokens (factor PATCH * MERGE = 8 pixels)
MIN_PIXELS, MAX_PIXELS = 8 * 8 * 4, 8 * 8 * 48
TEMPLATE = chat_template(
    turn_start="<|im_start|>{role}\n", turn_end="<|im_end|>\n",
    image="<|vision_start|><|image_pad|><|vision_end|>", assistant="<|im_start|>assistant\n",
)


def tokenizer():
    return word_tokenizer(SPECIAL, eos="<|im_end|>", pad="<|endoftext|>")


def processor_parts():
    """The image processor, tokenizer and video processor shared by Qwen2-VL and Qwen2.5-VL."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    image = Qwen2VLImageProcessor(patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE,
                                  min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    video = Qwen2VLVideoProcessor(patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE)
    return image, tokenizer(), video


def text_config(tok):
    return dict(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0},
        bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )


def token_ids(tok):
    ids = tok.convert_tokens_to_ids
    return dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


def build(dtype=torch.float32, attn_implementation="sdpa"):
    """``(model, processor)``: a seeded random Qwen2-VL of ~30k parameters and its processor."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    image, tok, video = processor_parts()
    processor = Qwen2VLProcessor(image_processor=image, tokenizer=tok, video_processor=video, chat_template=TEMPLATE)
    config = Qwen2VLConfig(
        text_config=text_config(tok),
        vision_config=dict(depth=2, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=PATCH,
                           spatial_merge_size=MERGE, temporal_patch_size=2),
        **token_ids(tok),
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).to(dtype).eval()
    return model, processor
