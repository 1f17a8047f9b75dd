"""Layouts at the released models' sizes: real processor settings and configurations, no weights.

The layout reads only the configuration and the processed inputs, so a module holding a default
configuration stands in for the model; the processors are the released settings built from code.
"""

from __future__ import annotations

import pytest
import torch
from family_checks import blank, check_tiling, prompt_inputs
from tiny_family_tokens import word_tokenizer
from torch import nn

from camkit.vlm.families.gemma3 import Gemma3Family
from camkit.vlm.families.idefics import Idefics3Family, SmolVLMFamily
from camkit.vlm.families.qwen_vl import Qwen2VLFamily, Qwen25VLFamily

SIZES = [(700, 1000), (480, 1500), (1200, 400)]


class ConfigOnly(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config


def qwen(version):
    import tiny_qwen2_vl
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLProcessor,
        Qwen2VLConfig,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = tiny_qwen2_vl.tokenizer()
    cls, config = (Qwen2VLProcessor, Qwen2VLConfig()) if version == 2 else (Qwen2_5_VLProcessor, Qwen2_5_VLConfig())
    processor = cls(image_processor=Qwen2VLImageProcessor(max_pixels=1280 * 28 * 28), tokenizer=tok,
                    video_processor=Qwen2VLVideoProcessor(), chat_template=tiny_qwen2_vl.TEMPLATE)
    config.image_token_id = tok.convert_tokens_to_ids("<|image_pad|>")
    return ConfigOnly(config), processor, Qwen2VLFamily() if version == 2 else Qwen25VLFamily()


def idefics(smol):
    import tiny_idefics3
    from transformers import Idefics3Config, Idefics3ImageProcessor, Idefics3Processor, SmolVLMConfig

    if smol:
        pytest.importorskip("num2words")
        from transformers import SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor
    tok = word_tokenizer(tiny_idefics3.SPECIAL, eos="<end_of_utterance>", pad="<|end_of_text|>", bos="<|begin_of_text|>")
    if smol:  # SmolVLM: 512-pixel views of 16-pixel patches, 4 x 4 shuffled: 64 tokens a view
        config = SmolVLMConfig(vision_config={"image_size": 512, "patch_size": 16}, scale_factor=4)
        image = SmolVLMImageProcessor(size={"longest_edge": 4 * 512}, max_image_size={"longest_edge": 512})
        processor = SmolVLMProcessor(image_processor=image, tokenizer=tok, video_processor=SmolVLMVideoProcessor(),
                                     image_seq_len=64, chat_template=tiny_idefics3.TEMPLATE)
    else:  # Idefics3: 364-pixel views of 14-pixel patches, 2 x 2 shuffled: 169 tokens a view
        config = Idefics3Config(vision_config={"image_size": 364, "patch_size": 14}, scale_factor=2)
        image = Idefics3ImageProcessor(size={"longest_edge": 4 * 364}, max_image_size={"longest_edge": 364})
        processor = Idefics3Processor(image_processor=image, tokenizer=tok, image_seq_len=169,
                                      chat_template=tiny_idefics3.TEMPLATE)
    config.image_token_id = tok.convert_tokens_to_ids("<image>")
    return ConfigOnly(config), processor, SmolVLMFamily() if smol else Idefics3Family()


def gemma3():
    import tiny_gemma3
    from transformers import Gemma3Config, Gemma3ImageProcessor, Gemma3Processor

    tok = word_tokenizer(tiny_gemma3.SPECIAL, eos="<eos>", pad="<pad>", bos="<bos>", extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    image = Gemma3ImageProcessor(size={"height": 896, "width": 896})
    processor = Gemma3Processor(image_processor=image, tokenizer=tok, chat_template=tiny_gemma3.TEMPLATE)
    config = Gemma3Config(vision_config={"image_size": 896, "patch_size": 14}, mm_tokens_per_image=256)
    config.image_token_id = tok.convert_tokens_to_ids("<image_soft_token>")
    return ConfigOnly(config), processor, Gemma3Family()


CASES = {"qwen2_vl": lambda: qwen(2), "qwen2_5_vl": lambda: qwen(25), "idefics3": lambda: idefics(False),
         "smolvlm": lambda: idefics(True), "gemma3": gemma3}


@pytest.mark.heavy
@pytest.mark.parametrize("name", list(CASES))
def test_released_sizes_lay_out_every_token(name):
    model, processor, family = CASES[name]()
    extra = {"do_pan_and_scan": True} if name == "gemma3" else {}
    inputs = prompt_inputs(processor, [blank(*s) for s in SIZES], **extra)
    layouts = family.layout(model, processor, inputs, SIZES)
    for b, layout in enumerate(layouts):
        expected = (inputs["input_ids"][b] == model.config.image_token_id).nonzero().reshape(-1)
        assert torch.equal(layout.positions, expected) and layout.count > 0
        check_tiling(layout)
        assert torch.equal(layout.feature_token.unique(), torch.arange(layout.count))
    rows = torch.cat([layout.feature_rows for layout in layouts])
    assert torch.equal(rows.sort().values, torch.arange(rows.numel()))  # each feature row feeds one token
    views = [int(layout.view.max()) + 1 for layout in layouts]
    if name in ("idefics3", "smolvlm"):  # the crops the image processor says it cuts, plus the global image
        grids = [processor.image_processor.get_number_of_image_patches(h, w, {}) for h, w in SIZES]
        assert views == [rows * cols + 1 for _, rows, cols in grids] and max(views) > 4
    if name == "gemma3":  # the whole image plus the crops the image processor returns for it
        settings = {k: v for k, v in processor.images_kwargs.items() if k.startswith("pan_and_scan")}
        crops = processor.image_processor([blank(*s) for s in SIZES], do_pan_and_scan=True, **settings)["num_crops"]
        assert views == [1 + int(n) for n in crops] and max(views) > 1
