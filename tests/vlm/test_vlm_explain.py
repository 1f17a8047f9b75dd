"""explain_generation: the tokens are generate's, Grad-CAM is the formula, batches equal single prompts."""

from __future__ import annotations

import pytest
import torch
from vlm_helpers import picture

import camkit
from camkit.vlm.families import family_of
from camkit.vlm.prompts import prepare

FAMILIES = ["llava", "llava_next", "paligemma"]


def _generated(model, processor, image, prompt, steps):
    """Greedy tokens and their log-probabilities from model.generate itself, eos cut."""
    (p,) = prepare(model, processor, family_of(model), image, prompt)
    with torch.no_grad():
        out = model.generate(**p.inputs, max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, p.inputs["input_ids"].shape[1] :]
    logp = torch.stack([step[0].float().log_softmax(-1)[t] for step, t in zip(out.logits, new)])
    eos = (new == 2).nonzero()
    end = int(eos[0, 0]) if eos.numel() else new.numel()
    return new[:end], logp[:end]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_tokens_explained_are_generates_and_a_given_answer_explains_the_same(request, name):
    model, processor = request.getfixturevalue(name)
    image = picture(40, 70, seed=5)
    result = camkit.explain_generation(model, processor, image, "what is this ?", max_new_tokens=4)
    assert not bool(result.explanations[0].flat.all())  # maps with something in them to compare
    tokens, logp = _generated(model, processor, image, "what is this ?", 4)
    assert result.token_ids[0].tolist() == tokens.tolist() and len(result.tokens[0]) == tokens.numel() > 0
    torch.testing.assert_close(result.scores[0], logp, rtol=1e-4, atol=1e-4)
    assert result.maps[0].shape == (tokens.numel(), 40, 70) and float(result.maps[0].max()) <= 1.0
    forced = camkit.explain_generation(model, processor, image, "what is this ?", answer=" ".join(result.tokens[0]))
    assert forced.token_ids[0].tolist() == tokens.tolist()
    torch.testing.assert_close(forced.maps[0], result.maps[0])
    torch.testing.assert_close(forced.scores[0], result.scores[0])


def test_gradcam_per_token_is_the_formula_on_the_selected_vision_hidden_state(llava):
    model, processor = llava
    image, answer = picture(40, 70, seed=4), "a red cat"
    result = camkit.explain_generation(model, processor, image, "what is this ?", answer=answer)
    (p,) = prepare(model, processor, family_of(model), image, "what is this ?")
    ids = torch.cat([p.inputs["input_ids"], torch.tensor([processor.tokenizer(answer, add_special_tokens=False)["input_ids"]])], 1)
    start = p.inputs["input_ids"].shape[1]
    inner = model.model
    with torch.no_grad():
        hidden = inner.vision_tower(p.inputs["pixel_values"], output_hidden_states=True).hidden_states
    selected = hidden[model.config.vision_feature_layer].detach().requires_grad_(True)  # [1, 17, D]
    features = inner.multi_modal_projector(selected[:, 1:])
    embeds = model.get_input_embeddings()(ids)
    embeds = embeds.masked_scatter((ids == 4)[..., None], features.reshape(-1, features.shape[-1]))
    logits = model(inputs_embeds=embeds).logits
    cams = []
    for t in range(ids.shape[1] - start):
        logp = logits[0, start + t - 1].log_softmax(-1)[ids[0, start + t]]
        (grad,) = torch.autograd.grad(logp, selected, retain_graph=True)
        weights = grad[0, 1:].mean(0)  # one image: the mean over its 16 patch rows
        cam = torch.relu(selected[0, 1:].detach() @ weights)
        torch.testing.assert_close(result.explanations[0].extras["unit_scores"][t], cam, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result.scores[0][t], logp.detach(), rtol=1e-5, atol=1e-5)
        cams.append(cam)
    assert len(cams) == 3 and all(float(c.max()) > 0 for c in cams)
    assert not any(param.grad is not None for param in model.parameters())


@pytest.mark.parametrize("name", ["llava_next", "paligemma"])
def test_a_batch_of_prompts_equals_each_prompt_alone(request, name):
    model, processor = request.getfixturevalue(name)
    images, prompts = [picture(40, 70, seed=5), picture(50, 30, seed=6)], ["what is this ?", "describe the picture"]
    batch = camkit.explain_generation(model, processor, images, prompts, max_new_tokens=2)
    assert not all(bool(e.flat.all()) for e in batch.explanations)
    for b in range(2):
        alone = camkit.explain_generation(model, processor, images[b], prompts[b], max_new_tokens=2)
        assert batch.token_ids[b].tolist() == alone.token_ids[0].tolist()
        torch.testing.assert_close(batch.scores[b], alone.scores[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(batch.explanations[b].raw, alone.explanations[0].raw, rtol=1e-3, atol=1e-6)
    assert [tuple(m.shape[1:]) for m in batch.maps] == [(40, 70), (50, 30)]


def test_batched_and_looped_backwards_agree_and_span_sums_the_phrase(llava, monkeypatch):
    from camkit.vlm.methods import gradcam

    model, processor = llava
    image = picture(40, 70, seed=7)
    with monkeypatch.context() as patch:  # the batched backward really runs (no silent fallback to the loop)
        patch.setattr(gradcam, "_looped", lambda *a: pytest.fail("fell back to one backward per token"))
        batched = camkit.explain_generation(model, processor, image, "what is this ?", answer="a red cat sat")
    looped = camkit.explain_generation(model, processor, image, "what is this ?", answer="a red cat sat", batched=False)
    chunked = camkit.explain_generation(model, processor, image, "what is this ?", answer="a red cat sat", batch_tokens=3)
    for other in (looped, chunked):
        torch.testing.assert_close(other.explanations[0].raw, batched.explanations[0].raw, rtol=1e-4, atol=1e-7)
    phrase = batched.span(1, 3)
    assert phrase.tokens == [["red cat"]] and phrase.maps[0].shape == (1, 40, 70)
    torch.testing.assert_close(phrase.scores[0], batched.scores[0][1:3].sum()[None], rtol=1e-5, atol=1e-5)
    with pytest.raises(camkit.InvalidInputError, match="span"):
        batched.span(2, 9)


def test_answers_of_other_lengths_in_one_batch_equal_each_alone(llava):
    model, processor = llava
    images, answers = [picture(40, 70, seed=5), picture(50, 30, seed=6)], ["a cat", "a red big cat on the left"]
    batch = camkit.explain_generation(model, processor, images, "what is this ?", answer=answers)
    assert [len(t) for t in batch.tokens] == [2, 7]
    for b in range(2):
        alone = camkit.explain_generation(model, processor, images[b], "what is this ?", answer=answers[b])
        torch.testing.assert_close(batch.scores[b], alone.scores[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(batch.explanations[b].raw, alone.explanations[0].raw, rtol=1e-3, atol=1e-6)
    with pytest.raises(camkit.InvalidInputError, match="shapes"):
        batch.maps_tensor()
