"""A tiny Gemma 3 (vision tower pooled 4 x 4 into the soft image tokens, pan-and-scan crops) and its processor."""

from __future__ import annotations

import torch
from tiny_family_tokens import chat_template, word_tokenizer

#: 48-pixel views of 4-pixel patches (12 x 12), average-pooled 4 x 4 into 3 x 3 = 9 image tokens
VIEW, PATCH, TOKENS = 48, 4, 9
SPECIAL = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
           "<image_soft_token>"]
TEMPLATE = chat_template(bos="<bos>", turn_start="<start_of_turn>{role}\n", turn_end="<end_of_turn>\n",
                         image="<start_of_image>", assistant="<start_of_turn>model\n")


def build(dtype=torch.float32, attn_implementation="sdpa", *, pan_and_scan=False):
    """``(model, processor)``: a seeded random Gemma 3; ``pan_and_scan=True`` turns the processor's crops on
    (crops of at least 16 pixels, up to 3 of them, for images more than 1.2 times wider than high or the reverse).
    """
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

    tok = word_tokenizer(SPECIAL, eos="<eos>", pad="<pad>", bos="<bos>", extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    image = Gemma3ImageProcessor(size={"height": VIEW, "width": VIEW}, do_pan_and_scan=pan_and_scan,
                                 pan_and_scan_min_crop_size=16, pan_and_scan_max_num_crops=3,
                                 pan_and_scan_min_ratio_to_activate=1.2)
    processor = Gemma3Processor(image_processor=image, tokenizer=tok, chat_template=TEMPLATE,
                                image_seq_length=TOKENS)
    # the processor's own defaults override its image processor's settings: make them the tiny ones
    processor.images_kwargs = {**Gemma3Processor.images_kwargs, "do_pan_and_scan": pan_and_scan,
                               "pan_and_scan_min_crop_size": 16, "pan_and_scan_max_num_crops": 3}
    ids = tok.convert_tokens_to_ids
    config = Gemma3Config(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                         sliding_window=16, max_position_embeddings=512, bos_token_id=ids("<bos>"),
                         eos_token_id=ids("<eos>"), pad_token_id=ids("<pad>")),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                           image_size=VIEW, patch_size=PATCH, vision_use_head=False),
        mm_tokens_per_image=TOKENS, boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).to(dtype).eval()
    # the projection starts at zero in transformers' initialisation; seeded random values make it carry the image
    with torch.no_grad():
        proj = model.model.multi_modal_projector.mm_input_projection_weight
        proj.copy_(torch.randn(proj.shape, generator=torch.Generator().manual_seed(1), dtype=proj.dtype) * 0.2)
    return model, processor
