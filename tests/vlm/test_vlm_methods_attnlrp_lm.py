"""camkit.AttnLRP through Hugging Face causal language models and the vision towers of vision-language models.

What is conserved. AttnLRP explains a token by its **logit**: with ``attention="cp"``, ``epsilon=0`` and no
biases, the relevance at the input embeddings sums to the logit exactly. A token's log-probability
``log_softmax(z)_t = z_t - logsumexp(z)`` is not a conservative map: gradient x input at the logits gives
``z_t - sum_j p_j z_j``, which is the log-probability plus the entropy ``H(p)`` of the next-token
distribution. A log-probability target therefore conserves ``log p_t + H(p)``, as
:func:`test_log_probability_target_conserves_log_probability_plus_entropy` shows; the VLM method
``"attnlrp"`` scores the logit for that reason.
"""

from __future__ import annotations

import pytest
import torch
from vlm_methods_lm import (
    LANGUAGE_MODELS,
    PatchBatch,
    causal_lm,
    lxt_relevance,
    token_log_prob,
    token_logit,
    zero_biases,
)

import camkit

pytest.importorskip("transformers")


def _inputs(model: torch.nn.Module, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    embeds = model.get_input_embeddings()(ids).detach()
    positions = torch.tensor([6, 4])  # a different token of each sample
    return embeds, positions, ids[torch.arange(2), positions]


@pytest.mark.parametrize("kind", LANGUAGE_MODELS)
def test_conserves_the_logit_on_a_bias_free_model(kind: str) -> None:
    model = zero_biases(causal_lm(kind))
    embeds, positions, tokens = _inputs(model)
    explainer = camkit.AttnLRP(model, "cp", epsilon=0.0, input_index="inputs_embeds")
    e = explainer.explain(embeds, token_logit(positions, tokens))
    with torch.no_grad():
        logits = model(inputs_embeds=embeds).logits
    expected = logits[torch.arange(2), positions - 1, tokens]
    torch.testing.assert_close(e.scores, expected)
    torch.testing.assert_close(e.raw.sum(dim=(1, 2)), expected, atol=1e-5, rtol=1e-4)
    assert e.extras["absorbed"].abs().max() < 1e-4
    # the tokens after the explained one (causal attention) take no relevance
    assert e.raw[1, 4:].abs().max() == 0 and e.raw[0, 6:].abs().max() == 0
    # AttnLRP's softmax rule leaves a share with the softmax's bias term: not conserved
    full = camkit.AttnLRP(model, epsilon=0.0, input_index="inputs_embeds").explain(
        embeds, token_logit(positions, tokens)
    )
    assert (full.extras["relevance"] - expected).abs().max() > 1e-4


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_log_probability_target_conserves_log_probability_plus_entropy(kind: str) -> None:
    model = causal_lm(kind)
    embeds, positions, tokens = _inputs(model)
    e = camkit.AttnLRP(model, "cp", epsilon=0.0, input_index="inputs_embeds").explain(
        embeds, token_log_prob(positions, tokens)
    )
    with torch.no_grad():
        logits = model(inputs_embeds=embeds).logits[torch.arange(2), positions - 1]
    log_p = logits.log_softmax(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    torch.testing.assert_close(e.scores, log_p[torch.arange(2), tokens])
    torch.testing.assert_close(e.extras["relevance"], log_p[torch.arange(2), tokens] + entropy, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", LANGUAGE_MODELS)
def test_equal_to_lxt(kind: str) -> None:
    """camkit on the model as loaded (SDPA, grouped heads) equals LXT's patches on the same weights (eager)."""
    pytest.importorskip("lxt")
    model = causal_lm(kind)
    anchor = causal_lm(kind, attn_implementation="eager")
    anchor.load_state_dict(model.state_dict())
    embeds, positions, tokens = _inputs(model)
    target = token_logit(positions, tokens)
    ours = camkit.AttnLRP(model, epsilon=0.0, input_index="inputs_embeds").explain(embeds, target).raw
    ref = lxt_relevance(kind, anchor, embeds, target)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-4)
    assert model.config._attn_implementation == "sdpa"
    # the anchor is not the plain gradient: the rules change the result
    leaf = embeds.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(target(anchor(inputs_embeds=leaf).logits).sum(), leaf)
    assert (leaf.detach() * grad - ref).abs().max() > 1e-3


def test_grouped_query_attention_in_sdpa_equals_eager() -> None:
    """SDPA's ``enable_gqa`` repeats the key and value heads: the uniform rule still splits ``q k^T``."""
    model = causal_lm("llama")
    eager = causal_lm("llama", attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    embeds, positions, tokens = _inputs(model)
    target = token_logit(positions, tokens)
    a = camkit.AttnLRP(model, epsilon=0.0, input_index="inputs_embeds").explain(embeds, target)
    b = camkit.AttnLRP(eager, epsilon=0.0, input_index="inputs_embeds").explain(embeds, target)
    torch.testing.assert_close(a.raw, b.raw, atol=1e-6, rtol=1e-4)


def test_qwen2_vl_vision_tower_conserves() -> None:
    """Qwen2-VL's vision tower (3-D patch embedding, 2-D rotary embedding, 2x2 patch merger), bias-free."""
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    torch.manual_seed(0)
    config = Qwen2VLVisionConfig(depth=2, embed_dim=16, hidden_size=24, num_heads=2, patch_size=4, mlp_ratio=2,
                                 attn_implementation="sdpa")  # fmt: skip
    tower = zero_biases(Qwen2VisionTransformerPretrainedModel(config).double().eval())
    grid = torch.tensor([[1, 4, 6]])  # 24 patches, 6 merged tokens
    probe = torch.randn(24, dtype=torch.float64)
    net = PatchBatch(tower, grid, probe)
    x = torch.randn(24, 3, 2, 4, 4, dtype=torch.float64)
    e = camkit.AttnLRP(net, "cp", epsilon=0.0).explain(x, 0)
    torch.testing.assert_close(e.raw.sum(), e.scores[0])
    assert e.raw.abs().sum() > 0 and e.raw[5].abs().sum() > 0


def test_token_target_is_the_log_probability_target() -> None:
    """camkit.TokenTarget given to camkit.AttnLRP scores what the hand-written log-probability target does."""
    model = causal_lm("qwen2")
    embeds, positions, tokens = _inputs(model)
    explainer = camkit.AttnLRP(model, "cp", epsilon=0.0, input_index="inputs_embeds")
    by_hand = explainer.explain(embeds, token_log_prob(positions, tokens))
    target = camkit.TokenTarget(positions[:, None], token_ids=tokens[:, None])
    e = explainer.explain(embeds, target)
    torch.testing.assert_close(e.scores, by_hand.scores)
    torch.testing.assert_close(e.raw, by_hand.raw)


def test_qwen2_5_vl_vision_tower_conserves() -> None:
    """Qwen2.5-VL's vision tower: RMS norms, gated MLPs, window attention with its token reordering, bias-free.

    Its RMS norm computes in float32 whatever the input's dtype, hence the tolerance of float32."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    torch.manual_seed(0)
    config = Qwen2_5_VLVisionConfig(depth=2, hidden_size=16, out_hidden_size=24, intermediate_size=32, num_heads=2,
                                    patch_size=4, window_size=16, fullatt_block_indexes=[1],
                                    attn_implementation="sdpa")  # fmt: skip
    tower = zero_biases(Qwen2_5_VisionTransformerPretrainedModel(config).double().eval())
    net = PatchBatch(tower, torch.tensor([[1, 8, 8]]), torch.randn(24, dtype=torch.float64))
    e = camkit.AttnLRP(net, "cp", epsilon=0.0).explain(torch.randn(64, 3, 2, 4, 4, dtype=torch.float64), 0)
    torch.testing.assert_close(e.raw.sum(), e.scores[0], rtol=1e-5, atol=1e-7)
    assert (e.raw.flatten(1).abs().sum(1) > 0).all()  # every patch takes some relevance
