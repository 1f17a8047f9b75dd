"""The vision-language methods "chefer" and "legrad": by hand from an eager model's own probabilities and autograd.

The reference runs the eager LLaVA with ``output_attentions=True``: its probabilities are the
tensors its attention multiplies the values with, so autograd gives the gradient of a token's
log-probability with respect to each layer's probabilities directly. camkit runs the SDPA model (the
same weights) and recomputes them.
"""

from __future__ import annotations

import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.vlm.methods import get_vlm_method

pytest.importorskip("transformers")

import tiny_llava
from vlm_methods_helpers import images, request, tiny_llava_pair

PROMPTS, ANSWERS = ["what is this ?", "describe the picture"], ["a red cat", "two dogs"]


def _eager_twin(layers: int = 2):
    """The SDPA model (built once), its processor, and an eager model with its weights (built once)."""
    model, processor = tiny_llava_pair(layers=layers)
    if layers not in _EAGER:
        _EAGER[layers], _ = tiny_llava.build(layers=layers, attn_implementation="eager")
        _EAGER[layers].load_state_dict(model.state_dict())
    return model, processor, _EAGER[layers]


_EAGER: dict[int, torch.nn.Module] = {}


def _log_prob(logits, b, p, token):
    return logits[b, p - 1].float().log_softmax(-1)[token]


def test_chefer_equals_the_formula_on_eager_probabilities() -> None:
    """Ā_l = mean_heads(relu(∂s/∂A_l ⊙ A_l)), R = I, R <- R + Ā_l R first to last; row p - 1 at the image tokens."""
    model, processor, eager = _eager_twin()
    req = request(model, processor, images(2), PROMPTS, ANSWERS)
    out = get_vlm_method("chefer")(req)
    run = eager(**req.inputs, output_attentions=True)
    for b in range(2):
        for t, (p, token) in enumerate(zip(req.positions[b][:, 0].tolist(), req.token_ids[b][:, 0].tolist())):
            grads = torch.autograd.grad(_log_prob(run.logits, b, p, token), run.attentions, retain_graph=True)
            relevance = torch.eye(run.attentions[0].shape[-1])
            for a, g in zip(run.attentions, grads):
                relevance = relevance + (g[b] * a[b]).clamp(min=0).mean(0) @ relevance
            expected = relevance[p - 1, req.layouts[b].positions]
            torch.testing.assert_close(out.scores[b][t], expected.detach(), rtol=1e-4, atol=1e-7)
            torch.testing.assert_close(out.log_probs[b][t], _log_prob(run.logits, b, p, token).detach(), rtol=1e-5, atol=1e-5)
        assert float(out.scores[b].std()) > 0
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("layers", [None, [-1]])
def test_legrad_equals_the_formula_on_eager_probabilities(layers) -> None:
    """s_l: the token's log-probability from layer l's output through the final norm and head; E_l = relu(∂s_l/∂A_l)
    averaged over heads, summed over queries; the mean over the layers read, at the image tokens."""
    model, processor, eager = _eager_twin(layers=3)
    req = request(model, processor, images(2), PROMPTS, ANSWERS, layers=layers)
    out = get_vlm_method("legrad")(req)
    decoder = eager.model.language_model
    read = [0, 1, 2] if layers is None else [2]
    outputs = []
    handles = [layer.register_forward_hook(lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o))
               for layer in decoder.layers]  # fmt: skip
    try:
        run = eager(**req.inputs, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    for b in range(2):
        for t, (p, token) in enumerate(zip(req.positions[b][:, 0].tolist(), req.token_ids[b][:, 0].tolist())):
            layer_scores = [eager.lm_head(decoder.norm(h[b, p - 1])).float().log_softmax(-1)[token] for h in outputs]
            torch.testing.assert_close(layer_scores[-1], _log_prob(run.logits, b, p, token))  # the last layer's is the model's
            found = []
            for index in read:
                (g,) = torch.autograd.grad(layer_scores[index], run.attentions[index], retain_graph=True)
                found.append(g[b].clamp(min=0).mean(0).sum(0))
            expected = torch.stack(found).mean(0)[req.layouts[b].positions]
            torch.testing.assert_close(out.scores[b][t], expected, rtol=1e-4, atol=1e-8)
        assert float(out.scores[b].std()) > 0


@pytest.mark.parametrize("name", ["chefer", "legrad"])
def test_eager_reads_as_sdpa(name: str) -> None:
    model, processor, eager = _eager_twin()
    pictures = images(1)
    got = get_vlm_method(name)(request(eager, processor, pictures, PROMPTS[:1], ANSWERS[:1]))
    want = get_vlm_method(name)(request(model, processor, pictures, PROMPTS[:1], ANSWERS[:1]))
    torch.testing.assert_close(got.scores[0], want.scores[0], rtol=1e-4, atol=1e-7)
    assert eager.config._attn_implementation == "eager"


@pytest.mark.parametrize("name", ["attention", "chefer"])
def test_a_padding_mask_over_image_tokens_leaves_them_nothing(name: str) -> None:
    """Planted: the attention mask hides all image tokens but one from every query, so only that one can be read.

    (Not LeGrad: its ``ReLU(∂s/∂A)`` weighs no probability, and the gradient at a masked key is its value's
    pull on the output whatever its probability, zero.)"""
    model, processor = tiny_llava_pair()
    req = request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1])
    image = req.layouts[0].positions
    mask = req.inputs["attention_mask"].clone()
    mask[0, image] = 0
    mask[0, image[5]] = 1
    hidden = type(req)(**{**req.__dict__, "inputs": {**req.inputs, "attention_mask": mask}})
    scores = get_vlm_method(name)(hidden).scores[0]  # [T, N]
    assert bool((scores[:, 5] > 1e-6).all())
    others = torch.cat([scores[:, :5], scores[:, 6:]], dim=1)
    assert float(others.abs().max()) == 0.0


def test_legrad_layers_out_of_range_are_refused() -> None:
    model, processor = tiny_llava_pair()
    with pytest.raises(InvalidInputError, match="layers must be indices of the language model's 2 layers"):
        get_vlm_method("legrad")(request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1], layers=[5]))


def test_a_phrase_is_the_gradient_of_its_summed_log_probabilities() -> None:
    """A span (K tokens in one target): Chefer's gradient is that of the sum, read through the sum of the rows."""
    model, processor, eager = _eager_twin()
    req = request(model, processor, images(1), PROMPTS[:1], ANSWERS[:1])
    span = type(req)(**{**req.__dict__, "positions": [req.positions[0].T], "token_ids": [req.token_ids[0].T]})
    out = get_vlm_method("chefer")(span)
    run = eager(**req.inputs, output_attentions=True)
    pairs = list(zip(req.positions[0][:, 0].tolist(), req.token_ids[0][:, 0].tolist()))
    grads = torch.autograd.grad(sum(_log_prob(run.logits, 0, p, tok) for p, tok in pairs), run.attentions)
    relevance = torch.eye(run.attentions[0].shape[-1])
    for a, g in zip(run.attentions, grads):
        relevance = relevance + (g[0] * a[0]).clamp(min=0).mean(0) @ relevance
    expected = sum(relevance[p - 1] for p, _ in pairs)[req.layouts[0].positions]
    torch.testing.assert_close(out.scores[0][0], expected.detach(), rtol=1e-4, atol=1e-7)
