"""hf:FOLDER for vision-language models: read from a local save_pretrained folder only, or a clear error naming what is missing."""

from __future__ import annotations

import json

import pytest

from camkit.errors import ModelLoadError
from camkit.modelload.hf import is_generation_model, load_hf_generation

transformers = pytest.importorskip("transformers")


def _tiny_llava(folder):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=16, patch_size=8, projection_dim=16)  # fmt: skip
    text = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2)  # fmt: skip
    LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_index=31)).save_pretrained(folder)


def test_missing_pieces_are_named(tmp_path):
    with pytest.raises(ModelLoadError, match="no such folder"):
        load_hf_generation(str(tmp_path / "absent"))
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_hf_generation(str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"--dtype 'int8'"):
        (tmp_path / "config.json").write_text("{}")
        load_hf_generation(str(tmp_path), dtype="int8")


def test_a_classifier_is_no_vision_language_model(tmp_path):
    from transformers import ViTConfig

    ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, image_size=8,
              patch_size=4).save_pretrained(tmp_path)  # fmt: skip
    assert not is_generation_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="not a vision-language model's"):
        load_hf_generation(str(tmp_path))


def test_a_folder_without_its_processor(tmp_path):
    _tiny_llava(tmp_path)
    assert is_generation_model(str(tmp_path)) and json.loads((tmp_path / "config.json").read_text())["text_config"]
    with pytest.raises(ModelLoadError, match=r"no processor could be read .*processor.save_pretrained"):
        load_hf_generation(str(tmp_path))
