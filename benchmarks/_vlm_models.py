"""LLaVA 1.5 configurations built from code for the vision-language case (random weights, nothing downloaded).

Sizes:

* ``tiny``: a CLIP tower of 3 blocks of width 32 on 32 x 32 images (patch 8: 16 image tokens), a
  Llama of 2 blocks of width 32, a vocabulary of 64 words (the CPU runs);
* ``small``: a ViT-B/14 tower at 336 x 336 (576 image tokens) and a 1.1B Llama (TinyLlama's
  shape: 22 blocks of width 2048, grouped keys and values), vocabulary 32,000 (a GPU);
* ``7b``: LLaVA 1.5 7B's shape: CLIP ViT-L/14 at 336 x 336 and Llama 2 7B (32 blocks of width
  4096), vocabulary 32,064, in bfloat16 (a GPU with 40 GB or more).

The processor is transformers' ``LlavaProcessor`` over a word-level tokenizer (a fixed word list,
then ``w0``, ``w1``... up to the vocabulary size) and LLaVA's image processor at the tower's size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

SIZES = ("tiny", "small", "7b")
WORDS = (
    "a the is of in on and with what this there it picture image cat dog red blue green small big left right "
    "describe user assistant USER ASSISTANT : ? . ,"
).split()
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>", "<image>")
CHAT = (
    "{% for message in messages %}{{ message['role'].upper() }}: "
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image> {% else %}{{ part['text'] }} {% endif %}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}ASSISTANT :{% endif %}"
)
PROMPT = "describe the picture ."

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(crop=32, patch=8, v_hidden=32, v_layers=3, v_heads=2, hidden=32, layers=2, heads=2, kv=2, inter=64,
                 vocab=64, dtype=torch.float32),
    "small": dict(crop=336, patch=14, v_hidden=768, v_layers=12, v_heads=12, hidden=2048, layers=22, heads=32, kv=4,
                  inter=5632, vocab=32000, dtype=torch.bfloat16),
    "7b": dict(crop=336, patch=14, v_hidden=1024, v_layers=24, v_heads=16, hidden=4096, layers=32, heads=32, kv=32,
               inter=11008, vocab=32064, dtype=torch.bfloat16),
}  # fmt: skip


def processor(size: str) -> Any:
    """The word-level ``LlavaProcessor`` of a configuration."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import LlavaImageProcessor, LlavaProcessor, PreTrainedTokenizerFast

    shape = SHAPES[size]
    words = list(SPECIALS) + WORDS
    words += [f"w{i}" for i in range(shape["vocab"] - len(words))]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", additional_special_tokens=["<image>"])  # fmt: skip
    tokenizer.image_token = "<image>"
    crop = shape["crop"]
    images = LlavaImageProcessor(size={"shortest_edge": crop}, crop_size={"height": crop, "width": crop})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=shape["patch"],
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=CHAT)  # fmt: skip


def config(size: str) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    s = SHAPES[size]
    vision = CLIPVisionConfig(hidden_size=s["v_hidden"], intermediate_size=4 * s["v_hidden"], num_hidden_layers=s["v_layers"],
                              num_attention_heads=s["v_heads"], image_size=s["crop"], patch_size=s["patch"],
                              projection_dim=s["v_hidden"])  # fmt: skip
    text = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                       num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                       max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    return LlavaConfig(vision_config=vision, text_config=text, image_token_id=4, vision_feature_layer=-2,
                       vision_feature_select_strategy="default", projector_hidden_act="gelu")  # fmt: skip


def build(size: str, device: torch.device | str = "cpu") -> tuple[nn.Module, Any]:
    """``(model, processor)`` of a configuration: random weights (seeded) made on ``device`` in its dtype, eval mode."""
    from transformers import LlavaForConditionalGeneration

    if size not in SHAPES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlavaForConditionalGeneration._from_config(config(size), dtype=SHAPES[size]["dtype"])
    model.generation_config.pad_token_id = 0
    return model.eval(), processor(size)


def image(size: str) -> torch.Tensor:
    """A seeded uint8 image [3, S, S] at the tower's size (the processor's resize and crop leave it as it is)."""
    crop = SHAPES[size]["crop"]
    rng = np.random.default_rng(0)
    return torch.from_numpy(rng.integers(0, 256, (3, crop, crop), dtype=np.uint8))


def chat(processor: Any, prompt: str = PROMPT) -> str:
    """The prompt through the processor's chat template, with the image first and the generation prompt."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return str(processor.apply_chat_template(messages, add_generation_prompt=True))
