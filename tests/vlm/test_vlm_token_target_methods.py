"""TokenTarget with camkit's own explainers of every family on a tiny LLaVA, x = pixel_values.

The answer's tokens ride along as the keyword input ``input_ids``; positions are given per
sample ([B, K], two different tokens per sample), so every method that reruns the model on
changed copies must give each copy its own sample's ``input_ids`` and positions.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from vlm_helpers import picture

import camkit
from camkit.functional.perturbation import rise_masks
from camkit.vlm.families import family_of
from camkit.vlm.prompts import prepare


def _hooks(model):
    return {
        (name, kind, key)
        for name, m in model.named_modules()
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        for key in getattr(m, kind)
    }


@pytest.fixture(scope="module")
def case(llava):
    """``(model, pixel_values [2, 3, 32, 32], input_ids [2, L + 3], positions [2, 2])`` and the hooks after a warm-up."""
    model, processor = llava
    prompts = prepare(model, processor, family_of(model), [picture(40, 70, seed=1), picture(50, 30, seed=2)], "what is this ?")
    prompt_ids = torch.cat([p.inputs["input_ids"] for p in prompts])
    ids = torch.cat([prompt_ids, torch.tensor([[10, 11, 12], [13, 14, 15]])], 1)
    pv = torch.cat([p.inputs["pixel_values"] for p in prompts])
    start = prompt_ids.shape[1]
    positions = torch.tensor([[start, start + 1], [start + 1, start + 2]])
    with torch.no_grad():
        model(input_ids=ids, pixel_values=pv, use_cache=False)
    return model, pv, ids, positions, _hooks(model)


def _log_prob(model, pv, ids, b, p):
    """log p(ids[b, p] | ids[b, :p], image) of sample b, by hand from the logits."""
    logits = model(input_ids=ids[b : b + 1], pixel_values=pv, use_cache=False).logits
    return logits[0, p - 1].float().log_softmax(-1)[ids[b, p]]


def _check_hygiene(model, hooks, pv, pv0, ids, ids0, flags):
    assert _hooks(model) == hooks
    assert all(p.grad is None for p in model.parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert not model.training and model.config._attn_implementation == "sdpa"
    assert torch.equal(pv, pv0) and torch.equal(ids, ids0)


def test_gradient_methods_saliency_and_gradcam(case):
    model, pv, ids, positions, hooks = case
    pv0, ids0 = pv.clone(), ids.clone()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    target = camkit.TokenTarget(positions, reduce="none")
    saliency = camkit.Saliency(model, input_index="pixel_values").explain(pv, target, kwargs={"input_ids": ids})
    assert saliency.raw.shape == (2, 2, 3, 32, 32)
    for b in range(2):
        for k in range(2):
            leaf = pv[b : b + 1].clone().requires_grad_(True)
            value = _log_prob(model, leaf, ids, b, int(positions[b, k]))
            (grad,) = torch.autograd.grad(value, leaf)
            torch.testing.assert_close(saliency.raw[b, k], grad[0], rtol=1e-4, atol=1e-7)
            torch.testing.assert_close(saliency.scores[b, k], value.detach(), rtol=1e-5, atol=1e-5)
    # Grad-CAM on the vision tower's selected hidden state: the batch equals each sample alone
    name = next(n for n, m in model.named_modules() if m is family_of(model).feature_layer(model))
    cam = camkit.GradCAM(model, name, input_index="pixel_values").explain(pv, target, kwargs={"input_ids": ids})
    for b in range(2):
        alone = camkit.GradCAM(model, name, input_index="pixel_values").explain(
            pv[b : b + 1], camkit.TokenTarget(positions[b], reduce="none"), kwargs={"input_ids": ids[b : b + 1]}
        )
        torch.testing.assert_close(cam.raw[b], alone.raw[0], rtol=1e-4, atol=1e-7)
    _check_hygiene(model, hooks, pv, pv0, ids, ids0, flags)


def test_smoothgrad_without_noise_is_saliency_with_rows_of_mixed_samples(case):
    """sigma=0 makes every noisy copy the image itself; chunks of 3 rows mix the two samples."""
    model, pv, ids, positions, hooks = case
    target = camkit.TokenTarget(positions, reduce="none")
    saliency = camkit.Saliency(model, input_index="pixel_values")
    plain = saliency.explain(pv, target, kwargs={"input_ids": ids})
    smooth = camkit.SmoothGrad(saliency, samples=2, sigma=0.0, max_batch=3, seed=0)
    got = smooth.explain(pv, target, kwargs={"input_ids": ids})
    torch.testing.assert_close(got.raw, plain.raw, rtol=1e-4, atol=1e-7)
    assert _hooks(model) == hooks


def test_attnlrp_runs_through_the_whole_llava(case):
    """AttnLRP's rules cover what LLaVA computes (SDPA, RMS norm, rotary products, SiLU-gated MLPs, CLIP's
    layer norm and quick GELU): the relevance of each token reaches the pixels; most of it stays with the
    text tokens' embeddings, which are not the explained input (``absorbed``)."""
    model, pv, ids, positions, hooks = case
    pv0, ids0 = pv.clone(), ids.clone()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    target = camkit.TokenTarget(positions, reduce="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error", camkit.CamkitWarning)  # no op left without a rule
        e = camkit.AttnLRP(model, input_index="pixel_values").explain(pv, target, kwargs={"input_ids": ids})
    assert e.raw.shape == (2, 2, 3, 32, 32) and bool(torch.isfinite(e.raw).all())
    assert bool((e.raw.abs().flatten(2).sum(-1) > 0).all())
    torch.testing.assert_close(e.extras["relevance"], e.raw.flatten(2).sum(-1), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(e.extras["delta"], e.extras["relevance"] - e.scores, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        for b in range(2):
            for k in range(2):
                hand = _log_prob(model, pv[b : b + 1], ids, b, int(positions[b, k]))
                torch.testing.assert_close(e.scores[b, k], hand, rtol=1e-5, atol=1e-5)
    for b in range(2):  # the batch equals each sample alone, each token alone
        alone = camkit.AttnLRP(model, input_index="pixel_values").explain(
            pv[b : b + 1], camkit.TokenTarget(int(positions[b, 1])), kwargs={"input_ids": ids[b : b + 1]}
        )
        torch.testing.assert_close(e.raw[b, 1], alone.raw[0], rtol=1e-4, atol=1e-7)
    _check_hygiene(model, hooks, pv, pv0, ids, ids0, flags)


def test_plain_lrp_says_to_use_attnlrp(case):
    model, pv, ids, positions, _ = case
    with pytest.warns(camkit.CamkitWarning, match="no rule for attention.*AttnLRP"):
        camkit.LRP(model, input_index="pixel_values").explain(pv, camkit.TokenTarget(positions), kwargs={"input_ids": ids})


def _grid(values, positions):
    """Scores over the whole sequence [L] at the image tokens, on LLaVA's 4 x 4 patch grid (row-major)."""
    return values[positions].reshape(4, 4)


def test_attention_rollout_is_the_vlm_rollout_on_the_patch_grid(case):
    """AttentionRollout with a TokenTarget: the rollout the vision-language method "attention" computes, row p - 1."""
    model, pv, ids, positions, hooks = case
    pv0, ids0 = pv.clone(), ids.clone()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    e = camkit.AttentionRollout(model, input_index="pixel_values").explain(
        pv, camkit.TokenTarget(positions, reduce="none"), kwargs={"input_ids": ids}
    )
    assert e.raw.shape == (2, 2, 4, 4) and e.maps.shape == (2, 2, 32, 32)
    eager = _eager(model)
    with torch.no_grad():
        attentions = eager(input_ids=ids, pixel_values=pv, use_cache=False, output_attentions=True).attentions
    length = ids.shape[1]
    product = torch.eye(length).expand(2, -1, -1)
    for a in attentions:
        product = (0.5 * a.mean(dim=1) + 0.5 * torch.eye(length)) @ product
    image = family_of(model).image_token_id(model)
    for b in range(2):
        where = (ids[b] == image).nonzero()[:, 0]
        for k in range(2):
            p = int(positions[b, k])
            torch.testing.assert_close(e.raw[b, k], _grid(product[b, p - 1], where), rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(e.scores[b, k], _log_prob(model, pv[b : b + 1], ids, b, p).detach(), rtol=1e-5, atol=1e-5)
    _check_hygiene(model, hooks, pv, pv0, ids, ids0, flags)


def _eager(model):
    """An eager twin of the SDPA model (same weights), whose attentions are the probabilities it multiplies with."""
    import tiny_llava

    if "eager" not in _TWINS:
        _TWINS["eager"], _ = tiny_llava.build(attn_implementation="eager")
        _TWINS["eager"].load_state_dict(model.state_dict())
    return _TWINS["eager"]


_TWINS: dict[str, torch.nn.Module] = {}


def test_chefer_rollout_is_chefers_formula_over_the_language_model(case):
    """CheferRollout with a TokenTarget: R = I, R <- R + mean_heads(relu(∂s/∂A_l ⊙ A_l)) R over the language model's
    layers, by hand from the eager twin's probabilities and autograd; a span sums its tokens' scores and rows."""
    model, pv, ids, positions, hooks = case
    pv0, ids0 = pv.clone(), ids.clone()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    explainer = camkit.CheferRollout(model, input_index="pixel_values")
    each = explainer.explain(pv, camkit.TokenTarget(positions, reduce="none"), kwargs={"input_ids": ids})
    span = explainer.explain(pv, camkit.TokenTarget(positions), kwargs={"input_ids": ids})
    assert each.raw.shape == (2, 2, 4, 4) and span.raw.shape == (2, 4, 4) and span.maps.shape == (2, 32, 32)
    run = _eager(model)(input_ids=ids, pixel_values=pv, use_cache=False, output_attentions=True)
    image = family_of(model).image_token_id(model)

    def by_hand(b, picked):
        score = sum(run.logits[b, p - 1].float().log_softmax(-1)[ids[b, p]] for p in picked)
        grads = torch.autograd.grad(score, run.attentions, retain_graph=True)
        relevance = torch.eye(ids.shape[1])
        for a, g in zip(run.attentions, grads):
            relevance = relevance + (g[b] * a[b]).clamp(min=0).mean(0) @ relevance
        return _grid(sum(relevance[p - 1] for p in picked), (ids[b] == image).nonzero()[:, 0]).detach()

    for b in range(2):
        picked = positions[b].tolist()
        for k in range(2):
            torch.testing.assert_close(each.raw[b, k], by_hand(b, picked[k : k + 1]), rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(span.raw[b], by_hand(b, picked), rtol=1e-4, atol=1e-7)
        assert float(each.raw[b].std()) > 0
    _check_hygiene(model, hooks, pv, pv0, ids, ids0, flags)


def test_legrad_needs_no_head_for_a_token_and_equals_the_vlm_method(case):
    """LeGrad with a TokenTarget reads the language model's own head (no head= asked); the batch equals each sample
    alone, and a class target still asks for head=."""
    model, pv, ids, positions, hooks = case
    pv0, ids0 = pv.clone(), ids.clone()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    explainer = camkit.LeGrad(model, input_index="pixel_values")
    batch = explainer.explain(pv, camkit.TokenTarget(positions, reduce="none"), kwargs={"input_ids": ids})
    for b in range(2):
        alone = explainer.explain(pv[b : b + 1], camkit.TokenTarget(positions[b], reduce="none"),
                                  kwargs={"input_ids": ids[b : b + 1]})  # fmt: skip
        torch.testing.assert_close(batch.raw[b], alone.raw[0], rtol=1e-4, atol=1e-8)
        torch.testing.assert_close(batch.scores[b], alone.scores[0], rtol=1e-5, atol=1e-5)
    assert bool((batch.raw >= 0).all()) and float(batch.raw.std()) > 0
    with pytest.raises(camkit.InvalidInputError, match="head="):
        explainer.explain(pv, 3, kwargs={"input_ids": ids})
    _check_hygiene(model, hooks, pv, pv0, ids, ids0, flags)


def test_attention_explainers_refuse_what_the_language_model_path_cannot_do(case, llava_next):
    model, pv, ids, positions, hooks = case
    target = camkit.TokenTarget(positions)
    with pytest.raises(camkit.InvalidInputError, match="head_fusion='mean'"):
        camkit.AttentionRollout(model, head_fusion="max", input_index="pixel_values").explain(
            pv, target, kwargs={"input_ids": ids}
        )
    with pytest.raises(camkit.InvalidInputError, match="input_ids"):
        camkit.CheferRollout(model, input_index="pixel_values").explain(pv, target, kwargs={"attention_mask": ids > 0})
    with pytest.raises(camkit.InvalidInputError, match="input_index='pixel_values'"):
        camkit.CheferRollout(model).explain(pv, target)
    assert _hooks(model) == hooks
    from torchvision.models import VisionTransformer

    vit = VisionTransformer(image_size=16, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16).eval()
    with pytest.raises(camkit.UnsupportedModelError, match="over a vision-language model's language model"):
        camkit.AttentionRollout(vit).explain(torch.rand(1, 3, 16, 16), target)
    next_model, processor = llava_next  # tiles: placed on the image by explain_generation, which has the processor
    prompt = prepare(next_model, processor, family_of(next_model), [picture(40, 70, seed=1)], "what is this ?")[0]
    inputs = dict(prompt.inputs)
    with pytest.raises(camkit.UnsupportedModelError, match=r"explain_generation.*method='chefer'"):
        camkit.CheferRollout(next_model, input_index="pixel_values").explain(
            inputs.pop("pixel_values"), camkit.TokenTarget(inputs["input_ids"].shape[1] - 1), kwargs=inputs
        )


def test_occlusion_is_the_log_probability_drop_per_window(case):
    model, pv, ids, positions, hooks = case
    pv0, ids0 = pv.clone(), ids.clone()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    occlusion = camkit.Occlusion(model, window=16, stride=16, batch_size=3, input_index="pixel_values")
    e = occlusion.explain(pv, camkit.TokenTarget(positions, reduce="none"), kwargs={"input_ids": ids})
    assert e.raw.shape == (2, 2, 32, 32)
    with torch.no_grad():
        for b in range(2):
            for k in range(2):
                p = int(positions[b, k])
                base = _log_prob(model, pv[b : b + 1], ids, b, p)
                for i in range(2):
                    for j in range(2):
                        covered = pv[b : b + 1].clone()
                        covered[..., 16 * i : 16 * i + 16, 16 * j : 16 * j + 16] = 0.0
                        drop = base - _log_prob(model, covered, ids, b, p)
                        block = e.raw[b, k, 16 * i : 16 * i + 16, 16 * j : 16 * j + 16]
                        torch.testing.assert_close(block, drop.expand(16, 16), rtol=1e-4, atol=1e-5)
    _check_hygiene(model, hooks, pv, pv0, ids, ids0, flags)


def test_rise_is_the_log_probability_weighted_mask_average(case):
    model, pv, ids, positions, hooks = case
    rise = camkit.RISE(model, masks=3, seed=0, grid=2, p=0.5, batch_size=4, input_index="pixel_values")
    e = rise.explain(pv, camkit.TokenTarget(positions, reduce="none"), kwargs={"input_ids": ids})
    grids, shifts = rise._plan((32, 32))
    masks = rise_masks(grids, shifts, (32, 32)).float()  # [3, 32, 32], the seeded plan
    assert masks.shape == (3, 32, 32) and 0 < float(masks.mean()) < 1
    with torch.no_grad():
        for b in range(2):
            for k in range(2):
                p = int(positions[b, k])
                hand = sum(_log_prob(model, pv[b : b + 1] * m, ids, b, p) * m for m in masks) / (3 * 0.5)
                torch.testing.assert_close(e.raw[b, k], hand, rtol=1e-4, atol=1e-5)
    assert _hooks(model) == hooks
