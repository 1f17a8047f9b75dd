"""TokenTarget: the log-probability of tokens of a teacher-forced sequence, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import camkit
from camkit.targets.tokens import token_log_probs


def _by_hand(logits: torch.Tensor, b: int, p: int, token: int) -> float:
    row = logits[b, p - 1].double()
    return float(row[token] - torch.logsumexp(row, dim=0))


@pytest.fixture
def sequence():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=gen)
    input_ids = torch.randint(0, 7, (2, 5), generator=gen)
    return logits, input_ids


def test_one_position_is_the_log_softmax_of_the_row_before(sequence):
    logits, ids = sequence
    got = camkit.TokenTarget(3)(logits, input_ids=ids)
    want = [_by_hand(logits, b, 3, int(ids[b, 3])) for b in range(2)]
    assert got.dtype == torch.float32 and got.shape == (2,)
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)


def test_a_span_is_the_sum_of_its_tokens_and_reduce_none_keeps_them_apart(sequence):
    logits, ids = sequence
    each = [[_by_hand(logits, b, p, int(ids[b, p])) for p in (1, 2, 4)] for b in range(2)]
    summed = camkit.TokenTarget([1, 2, 4])(logits, input_ids=ids)
    torch.testing.assert_close(summed.double(), torch.tensor([sum(r) for r in each], dtype=torch.float64), rtol=1e-6, atol=1e-6)
    apart = camkit.TokenTarget(torch.tensor([1, 2, 4]), reduce="none")(logits, input_ids=ids)
    torch.testing.assert_close(apart.double(), torch.tensor(each, dtype=torch.float64), rtol=1e-6, atol=1e-6)


def test_per_sample_positions_and_given_tokens(sequence):
    logits, ids = sequence
    positions = torch.tensor([[1, 4], [2, 3]])
    got = camkit.TokenTarget(positions)(logits, input_ids=ids)
    want = [sum(_by_hand(logits, b, int(p), int(ids[b, p])) for p in positions[b]) for b in range(2)]
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    tokens = torch.tensor([[6, 0], [1, 1]])
    given = camkit.TokenTarget(positions, token_ids=tokens)(logits)  # no input_ids needed
    want = [sum(_by_hand(logits, b, int(p), int(t)) for p, t in zip(positions[b], tokens[b])) for b in range(2)]
    torch.testing.assert_close(given.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    assert camkit.TokenTarget(2, token_ids=5)(logits).tolist() == pytest.approx(
        [_by_hand(logits, b, 2, 5) for b in range(2)], abs=1e-6)


def test_it_reads_logits_from_an_output_object_in_float32(sequence):
    logits, ids = sequence
    half = logits.to(torch.bfloat16)
    got = camkit.TokenTarget(1)({"logits": half}, input_ids=ids)
    assert got.dtype == torch.float32
    want = [_by_hand(half.float(), b, 1, int(ids[b, 1])) for b in range(2)]
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    probs = token_log_probs(logits, torch.tensor([[1], [1]]), ids[:, 1:2]).exp()
    assert float(probs.max()) <= 1.0 and math.isclose(float(probs[0, 0]), math.exp(want[0]), rel_tol=1e-2)


@pytest.mark.parametrize(
    ("positions", "token_ids", "match"),
    [
        (0, None, "position 0 cannot be scored"),
        ([1, -2], None, "position -2 cannot be scored"),
        ([], None, "empty"),
        (1.5, None, "integers"),
        (True, None, "bools"),
        ([1, 2], [3], "one token per position"),
        (torch.ones(1, 1, 1, dtype=torch.long), None, r"\[B, K\]"),
        (1, -1, "negative"),
    ],
)
def test_bad_positions_and_tokens_are_refused_up_front(positions, token_ids, match):
    with pytest.raises(camkit.InvalidTargetError, match=match):
        camkit.TokenTarget(positions, token_ids)


def test_errors_at_call_name_the_fix(sequence):
    logits, ids = sequence
    with pytest.raises(camkit.InvalidTargetError, match="past the end of the sequence"):
        camkit.TokenTarget(5)(logits, input_ids=ids)
    with pytest.raises(camkit.InvalidTargetError, match="the batch has 2 samples"):
        camkit.TokenTarget(torch.tensor([[1], [2], [3]]))(logits, input_ids=ids)
    with pytest.raises(camkit.InvalidTargetError, match="input_ids="):
        camkit.TokenTarget(1)(logits)
    with pytest.raises(camkit.InvalidTargetError, match="out of range for a vocabulary of 7"):
        camkit.TokenTarget(1, token_ids=7)(logits)
    with pytest.raises(camkit.OutputSelectionError, match=r"\[B, L, V\]"):
        camkit.TokenTarget(1)(logits[:, 0])


class _ImageLM(nn.Module):
    """A tiny 'language model' over an image: logits [B, L, V] from input_ids and a 2x2 image."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.pixels = nn.Linear(4, 4)
        self.head = nn.Linear(4, 5)

    def forward(self, pixel_values: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        image = self.pixels(pixel_values.flatten(1))[:, None]
        return self.head(torch.tanh(self.embed(input_ids).cumsum(1) + image))


def test_an_explainer_binds_the_input_ids_of_its_call():
    torch.manual_seed(0)
    model = _ImageLM().eval()
    x = torch.rand(2, 1, 2, 2)
    ids = torch.tensor([[1, 2, 3], [4, 0, 2]])
    target = camkit.TokenTarget([1, 2])
    e = camkit.Saliency(model, input_index="pixel_values").explain(x, target, kwargs={"input_ids": ids})
    # the score is the log-probability of the tokens of the call's own input_ids
    want = target(model(x, input_ids=ids), input_ids=ids)
    torch.testing.assert_close(e.scores, want.detach())
    # and the saliency is the gradient of that score
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(target(model(xg, input_ids=ids), input_ids=ids).sum(), xg)
    torch.testing.assert_close(e.raw, grad, rtol=1e-5, atol=1e-7)
    assert not model._forward_pre_hooks and getattr(target._local, "input_ids", None) is None


def test_for_rows_takes_per_sample_positions_and_tokens_row_by_row():
    logits = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(2))
    target = camkit.TokenTarget(torch.tensor([[1, 2], [3, 1]]), token_ids=torch.tensor([[0, 1], [2, 3]]), reduce="none")
    rows = torch.tensor([1, 1, 0])
    picked = target.for_rows(rows)
    assert picked.positions.tolist() == [[3, 1], [3, 1], [1, 2]]
    assert picked.token_ids.tolist() == [[2, 3], [2, 3], [0, 1]]
    want = logits.log_softmax(-1)
    expected = torch.stack([want[0, 2, 2], want[0, 0, 3], want[1, 2, 2], want[1, 0, 3], want[2, 0, 0], want[2, 1, 1]])
    torch.testing.assert_close(picked(logits).flatten(), expected)
    assert target.positions.tolist() == [[1, 2], [3, 1]]  # the original is untouched
    shared = camkit.TokenTarget([1, 2])
    assert shared.for_rows(rows) is shared  # one span for every sample needs no rows


def test_occlusion_scores_each_copy_with_its_samples_input_ids_and_positions():
    torch.manual_seed(0)
    model = _ImageLM().eval()
    x = torch.rand(2, 1, 2, 2)
    ids = torch.tensor([[1, 2, 3], [4, 0, 2]])
    target = camkit.TokenTarget(torch.tensor([[1], [2]]))
    e = camkit.Occlusion(model, window=1, stride=1, batch_size=3, input_index="pixel_values").explain(
        x, target, kwargs={"input_ids": ids}
    )
    with torch.no_grad():
        for b, p in ((0, 1), (1, 2)):
            base = model(x[b : b + 1], ids[b : b + 1])[0, p - 1].log_softmax(-1)[ids[b, p]]
            for i in range(2):
                for j in range(2):
                    covered = x[b : b + 1].clone()
                    covered[..., i, j] = 0
                    drop = base - model(covered, ids[b : b + 1])[0, p - 1].log_softmax(-1)[ids[b, p]]
                    torch.testing.assert_close(e.raw[b, i, j], drop, rtol=1e-5, atol=1e-6)
