"""A tiny Qwen2.5-VL (window attention in the vision tower, 2x2 merged patches) and its processor."""

from __future__ import annotations

import torch
from tiny_qwen2_vl import MERGE, PATCH, TEMPLATE, processor_parts, text_config, token_ids

#: window of the vision tower's windowed blocks, in pixels: 2 x 2 merged tokens per window
WINDOW = 2 * MERGE * PATCH


def build(dtype=torch.float32, attn_implementation="sdpa"):
    """``(model, processor)``: a seeded random Qwen2.5-VL whose first vision block attends within windows."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    image, tok, video = processor_parts()
    processor = Qwen2_5_VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                    chat_template=TEMPLATE)
    config = Qwen2_5_VLConfig(
        text_config=text_config(tok),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, window_size=WINDOW,
                           fullatt_block_indexes=[1]),
        **token_ids(tok),
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).to(dtype).eval()
    return model, processor
