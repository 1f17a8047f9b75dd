"""explain_generation leaves the model as loaded, refuses bad input clearly, and runs in half precision;
TokenTarget drives camkit's own explainers on a vision-language model."""

from __future__ import annotations

import pytest
import torch
from vlm_helpers import picture

import camkit
from camkit.vlm.families import family_of
from camkit.vlm.prompts import prepare


def _hooks(model):
    """Every hook on the model's modules (transformers installs its own output recorders at the first forward)."""
    return {
        (name, kind, key)
        for name, m in model.named_modules()
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        for key in getattr(m, kind)
    }


def _warm(model, processor):
    (p,) = prepare(model, processor, family_of(model), picture(40, 70), "what is this ?")
    with torch.no_grad():
        model(**p.inputs)
    return _hooks(model)


@pytest.mark.parametrize("frozen", [False, True])
def test_the_model_is_left_as_loaded(llava, frozen):
    model, processor = llava
    hooks = _warm(model, processor)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    before = {"attn": model.config._attn_implementation, "vision_attn": model.config.vision_config._attn_implementation}
    model.config.use_cache = False
    model.train()
    if frozen:
        model.requires_grad_(False)
    image = torch.randint(0, 256, (3, 40, 70), dtype=torch.uint8)
    copy = image.clone()
    try:
        result = camkit.explain_generation(model, processor, image, "what is this ?", max_new_tokens=3)
        assert result.maps[0].shape[1:] == (40, 70)
        assert _hooks(model) == hooks and all(p.grad is None for p in model.parameters())
        assert all(m.training for m in model.modules()) and model.config.use_cache is False
        assert {"attn": model.config._attn_implementation, "vision_attn": model.config.vision_config._attn_implementation} == before
        assert all(p.requires_grad == (flags[n] and not frozen) for n, p in model.named_parameters())
        assert torch.equal(image, copy)
    finally:
        model.eval().requires_grad_(True)
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
        model.config.use_cache = True


def test_bad_input_is_refused_with_the_fix(llava):
    import tiny_llava
    from transformers import LlamaConfig, LlamaForCausalLM

    model, processor = llava
    bare = tiny_llava.processor(chat_template=None)
    with pytest.raises(camkit.InvalidInputError, match="no image token"):
        camkit.explain_generation(model, bare, picture(40, 70), "what is this ?")
    with pytest.raises(camkit.InvalidInputError, match="processor refused image 0"):
        camkit.explain_generation(model, processor, torch.zeros(3, 0, 5, dtype=torch.uint8), "what is this ?")
    with pytest.raises(camkit.InvalidInputError, match=r"\[3, H, W\]"):
        camkit.explain_generation(model, processor, torch.zeros(40, 70), "what is this ?")
    with pytest.raises(camkit.InvalidInputError, match=r"outside \[0, 1\]"):
        camkit.explain_generation(model, processor, torch.full((3, 40, 70), -2.0), "what is this ?")
    with pytest.raises(camkit.InvalidInputError, match="one prompt"):
        camkit.explain_generation(model, processor, [picture(40, 70)] * 2, ["a", "b", "c"])
    with pytest.raises(camkit.UnknownMethodError, match="gradcam"):
        camkit.explain_generation(model, processor, picture(40, 70), "what is this ?", method="gradcamm")
    with pytest.raises(camkit.InvalidInputError, match="batch_tokens"):
        camkit.explain_generation(model, processor, picture(40, 70), "what is this ?", answer="a cat", batch_tokens=0)
    text_only = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2))
    with pytest.raises(camkit.UnsupportedModelError, match="model_type 'llama'"):
        camkit.explain_generation(text_only, processor, picture(40, 70), "what is this ?")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_and_keeps_to_float32s_map(llava, dtype):
    import tiny_llava

    full, processor = llava
    half, _ = tiny_llava.build(dtype)
    image = picture(40, 70, seed=5)
    ref = camkit.explain_generation(full, processor, image, "what is this ?", answer="a red cat")
    got = camkit.explain_generation(half, processor, image, "what is this ?", answer="a red cat")
    assert got.maps[0].dtype == torch.float32 and bool(torch.isfinite(got.maps[0]).all())
    torch.testing.assert_close(got.scores[0], ref.scores[0], rtol=0, atol=0.01)  # seen: 1e-3 (bf16), 1e-4 (fp16)
    a, b = got.explanations[0].extras["unit_scores"], ref.explanations[0].extras["unit_scores"]
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=1)
    assert bool((cosine > 0.999).all()), cosine  # seen: above 0.99996


def test_token_target_drives_camkits_gradcam_on_the_pixel_values(llava):
    model, processor = llava
    hooks = _warm(model, processor)
    family = family_of(model)
    image = picture(40, 70, seed=5)
    result = camkit.explain_generation(model, processor, image, "what is this ?", answer="a red cat")
    (p,) = prepare(model, processor, family, image, "what is this ?")
    answer = result.token_ids[0][None]
    ids = torch.cat([p.inputs["input_ids"], answer], 1)
    start = p.inputs["input_ids"].shape[1]
    name = next(n for n, m in model.named_modules() if m is family.feature_layer(model))
    explainer = camkit.GradCAM(model, name, input_index="pixel_values")
    target = camkit.TokenTarget(torch.arange(start, ids.shape[1]), reduce="none")
    e = explainer.explain(p.inputs["pixel_values"], target, kwargs={"input_ids": ids})
    assert e.raw.shape == (1, 3, 4, 4)  # three tokens, the 4 x 4 patch grid (the CLS row left out)
    torch.testing.assert_close(e.raw[0].reshape(3, 16), result.explanations[0].extras["unit_scores"], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(e.scores[0], result.scores[0], rtol=1e-5, atol=1e-5)
    assert _hooks(model) == hooks


def test_one_forward_explains_every_token_and_eager_attention_gives_sdpas_maps(llava):
    import tiny_llava

    model, processor = llava
    eager, _ = tiny_llava.build(attn_implementation="eager")
    image = picture(40, 70, seed=5)
    calls = []
    handle = model.model.vision_tower.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        sdpa = camkit.explain_generation(model, processor, image, "what is this ?", answer="a red cat on the left")
    finally:
        handle.remove()
    assert len(calls) == 1 and len(sdpa.tokens[0]) == 6
    got = camkit.explain_generation(eager, processor, image, "what is this ?", answer="a red cat on the left")
    assert eager.config._attn_implementation == "eager"
    torch.testing.assert_close(got.explanations[0].raw, sdpa.explanations[0].raw, rtol=1e-4, atol=1e-6)


def test_layer_by_name_or_module_and_a_layer_without_the_rows_is_refused(llava):
    model, processor = llava
    image, name = picture(40, 70, seed=5), "model.vision_tower.encoder.layers.0"
    by_name = camkit.explain_generation(model, processor, image, "what is this ?", answer="a cat", layer=name)
    by_module = camkit.explain_generation(
        model, processor, image, "what is this ?", answer="a cat", layer=model.model.vision_tower.encoder.layers[0]
    )
    assert by_name.explanations[0].layers == (name,)
    torch.testing.assert_close(by_name.explanations[0].raw, by_module.explanations[0].raw)
    with pytest.raises(camkit.InvalidInputError, match="has 16 rows but the layout reads row 16"):
        camkit.explain_generation(model, processor, image, "what is this ?", answer="a cat", layer="model.multi_modal_projector")


def test_a_float_image_in_unit_range_reads_as_its_uint8_pixels(llava):
    model, processor = llava
    pixels = torch.randint(0, 256, (3, 40, 70), dtype=torch.uint8)
    as_bytes = camkit.explain_generation(model, processor, pixels, "what is this ?", answer="a cat")
    as_floats = camkit.explain_generation(model, processor, pixels.float() / 255, "what is this ?", answer="a cat")
    torch.testing.assert_close(as_floats.explanations[0].raw, as_bytes.explanations[0].raw)
