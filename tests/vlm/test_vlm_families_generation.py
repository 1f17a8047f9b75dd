"""explain_generation on Qwen2-VL, Qwen2.5-VL, Idefics3, SmolVLM and Gemma 3: generate's tokens, batches."""

from __future__ import annotations

import importlib

import pytest
import torch
from vlm_helpers import picture

import camkit
from camkit.vlm.families import family_of
from camkit.vlm.generate import stop_ids
from camkit.vlm.prompts import prepare

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm", "gemma3"]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    if request.param == "smolvlm":
        pytest.importorskip("num2words")  # SmolVLM's processor needs it
    return importlib.import_module(f"tiny_{request.param}").build()


def generated(model, processor, image, prompt, steps):
    """Greedy tokens and their log-probabilities from model.generate itself, cut at the first stop token."""
    (p,) = prepare(model, processor, family_of(model), image, prompt)
    with torch.no_grad():
        out = model.generate(**p.inputs, max_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    new = out.sequences[0, p.inputs["input_ids"].shape[1] :]
    logp = torch.stack([step[0].float().log_softmax(-1)[t] for step, t in zip(out.logits, new)])
    stops = torch.isin(new, torch.tensor(sorted(stop_ids(model, processor)))).nonzero()
    end = int(stops[0, 0]) if stops.numel() else new.numel()
    return new[:end], logp[:end]


def test_the_tokens_explained_are_generates(tiny):
    model, processor = tiny
    image = picture(40, 70, seed=5)
    flags = [p.requires_grad for p in model.parameters()]
    result = camkit.explain_generation(model, processor, image, "what is this ?", max_new_tokens=3)
    tokens, logp = generated(model, processor, image, "what is this ?", 3)
    assert tokens.numel() > 0 and result.token_ids[0].tolist() == tokens.tolist()
    torch.testing.assert_close(result.scores[0], logp, rtol=1e-4, atol=1e-4)
    assert result.maps[0].shape == (tokens.numel(), 40, 70)
    assert float(result.maps[0].amax()) > 0  # Grad-CAM found something on the image for these tokens
    # as loaded: SDPA, no gradients or hooks left behind, evaluation mode
    assert model.config._attn_implementation == "sdpa" and not model.training
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_explains(name):
    if name == "smolvlm":
        pytest.importorskip("num2words")
    model, processor = importlib.import_module(f"tiny_{name}").build(dtype=torch.bfloat16)
    result = camkit.explain_generation(model, processor, picture(40, 70, seed=5), "what is this ?", max_new_tokens=2)
    assert result.maps[0].shape[1:] == (40, 70) and bool(torch.isfinite(result.maps[0]).all())
    assert next(model.parameters()).dtype == torch.bfloat16


def test_a_batch_of_prompts_equals_each_prompt_alone(tiny):
    model, processor = tiny
    images, prompts = [picture(40, 70, seed=5), picture(50, 30, seed=6)], ["what is this ?", "describe the picture"]
    batch = camkit.explain_generation(model, processor, images, prompts, max_new_tokens=2)
    for b in range(2):
        alone = camkit.explain_generation(model, processor, images[b], prompts[b], max_new_tokens=2)
        assert batch.token_ids[b].tolist() == alone.token_ids[0].tolist()
        torch.testing.assert_close(batch.scores[b], alone.scores[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(batch.maps[b], alone.maps[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_gradcam_is_the_formula_on_the_merger_output(name):
    """By hand: the gradient of each token's log-probability at the image features in the language model's
    order (Qwen2.5-VL's merger emits them in window order), the image's channel means, ReLU of the weighted sum."""
    model, processor = importlib.import_module(f"tiny_{name}").build()
    image, answer = picture(40, 70, seed=4), "a red cat"
    result = camkit.explain_generation(model, processor, image, "what is this ?", answer=answer)
    (p,) = prepare(model, processor, family_of(model), image, "what is this ?")
    extra = torch.tensor([processor.tokenizer(answer, add_special_tokens=False)["input_ids"]])
    ids = torch.cat([p.inputs["input_ids"], extra], 1)
    types = torch.cat([p.inputs["mm_token_type_ids"], torch.zeros_like(extra)], 1)
    grid = p.inputs["image_grid_thw"]
    with torch.no_grad():
        features = torch.cat(model.model.get_image_features(p.inputs["pixel_values"], grid).pooler_output)
    features.requires_grad_(True)
    embeds = model.get_input_embeddings()(ids).masked_scatter((ids == model.config.image_token_id)[..., None], features)
    logits = model(input_ids=ids, inputs_embeds=embeds, mm_token_type_ids=types, image_grid_thw=grid).logits
    start = p.inputs["input_ids"].shape[1]
    for t in range(extra.shape[1]):
        logp = logits[0, start + t - 1].log_softmax(-1)[ids[0, start + t]]
        (grad,) = torch.autograd.grad(logp, features, retain_graph=True)
        cam = torch.relu(features.detach() @ grad.mean(0))
        assert float(cam.max()) > 0
        torch.testing.assert_close(result.explanations[0].extras["unit_scores"][t], cam, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result.scores[0][t], logp.detach(), rtol=1e-5, atol=1e-5)
