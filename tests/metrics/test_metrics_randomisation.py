"""Randomisation measures: MPRT (cascading, independent, smoothed), efficient MPRT, random logit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from torch import nn

import camkit
from camkit.errors import InvalidInputError
from camkit.metrics import efficient_mprt, mprt, random_logit, spearman
from camkit.metrics.randomisation import discrete_entropy
from tests.models import RankNet, rank_input


class Scale(nn.Module):
    """x -> w * x, one scalar weight: a map w1 * w2 * x through two of them is known by hand."""

    def __init__(self, w: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))

    def forward(self, x):
        return self.w * x


def product_net() -> nn.Sequential:
    return nn.Sequential(Scale(2.0), Scale(3.0), nn.Flatten(), nn.Linear(8, 2))


def weight_map(model: nn.Module):
    """An 'explainer' whose map is w0 * w1 * x[:, 0]: its sign follows the two weights."""
    return lambda x, target: model[0].w.detach() * model[1].w.detach() * x[:, 0]


def flip(module: nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.neg_()


def grad_x_input(model: nn.Module, x, y) -> torch.Tensor:
    x = torch.as_tensor(x).clone().requires_grad_(True)
    y = torch.as_tensor(y).long()
    out = model(x)
    (grad,) = torch.autograd.grad(out.gather(1, y[:, None]).sum(), x)
    return (grad * x).sum(dim=1).detach()


def gxi_factory(model: nn.Module):
    return lambda x, target: grad_x_input(model, x, target)


# ---- MPRT by hand --------------------------------------------------------------------------


def test_mprt_cascading_and_independent_by_hand() -> None:
    x = torch.rand(2, 1, 8, generator=torch.Generator().manual_seed(0))
    net = product_net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    cascade = mprt(weight_map, net, x, 0, order="top-down", layers=["1", "0"], randomize=flip)
    # step 1 flips w1: map -x (Spearman -1); step 2 flips w0 too: map +x again (+1)
    assert cascade.layers == ("1", "0")
    torch.testing.assert_close(cascade.similarity, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    torch.testing.assert_close(cascade.average, torch.zeros(2))
    torch.testing.assert_close(cascade.original, torch.ones(2))
    independent = mprt(weight_map, net, x, 0, order="independent", layers=["1", "0"], randomize=flip)
    torch.testing.assert_close(independent.similarity, -torch.ones(2, 2))
    last = mprt(weight_map, net, x, 0, layers=["1", "0"], randomize=flip, last_only=True)
    assert last.layers == ("0",)
    torch.testing.assert_close(last.last, torch.ones(2))
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # the model is never touched


def test_maps_with_a_channel_axis_are_compared_whole() -> None:
    x = torch.rand(2, 2, 4, generator=torch.Generator().manual_seed(0))
    net = product_net()
    per_channel = lambda model: lambda inputs, target: model[0].w.detach() * model[1].w.detach() * inputs  # noqa: E731
    cascade = mprt(per_channel, net, x, 0, order="top-down", layers=["1", "0"], randomize=flip)
    torch.testing.assert_close(cascade.similarity, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    given = mprt(per_channel, net, x, 0, layers=["1", "0"], maps=6 * x, randomize=flip, last_only=True)
    torch.testing.assert_close(given.last, torch.ones(2))
    seen = []
    mprt(per_channel, net, x, 0, layers=["1"], randomize=flip, similarity=lambda a, b: seen.append(b.shape) or spearman(a, b))
    assert seen == [torch.Size([2, 2, 4])] * 2  # the self-check and the one step, channels kept


def test_default_layers_follow_the_forward_pass() -> None:
    net = RankNet(2)
    res = mprt(lambda m: camkit.GradCAM(m, "conv2"), net, rank_input(2, batch=2), order="bottom-up")
    assert res.layers == ("conv1", "bn1", "conv2", "fc")
    top = mprt(lambda m: camkit.GradCAM(m, "conv2"), net, rank_input(2, batch=2), last_only=True)
    assert top.layers == ("conv1",)


def test_smooth_mprt_averages_noisy_copies_by_hand() -> None:
    x = torch.rand(2, 1, 8, generator=torch.Generator().manual_seed(0)) * 4
    seen: list[torch.Tensor] = []

    def similarity(a, b):
        seen.append(a)
        return spearman(a, b)

    mprt(weight_map, product_net(), x, 0, layers=["1"], randomize=flip, samples=4, noise_magnitude=0.5,
         generator=torch.Generator().manual_seed(7), similarity=similarity)  # fmt: skip
    span = (x.amax(dim=(1, 2)) - x.amin(dim=(1, 2)))[:, None, None]
    eps = torch.randn((3, 2, 1, 8), generator=torch.Generator().manual_seed(7)) * 0.5 * span
    expected = 6.0 * (x[:, 0] + eps[:, :, 0].sum(0) / 4)  # three noisy copies and x itself, averaged
    torch.testing.assert_close(seen[0], expected)


@pytest.mark.parametrize("dims", [1, pytest.param(2, marks=pytest.mark.slow), 3])
def test_mprt_batch_equals_one_by_one_every_rank(dims: int) -> None:
    net = RankNet(dims)
    x = rank_input(dims, batch=3)
    flags = [m.training for m in net.modules()]
    kwargs = {"order": "independent", "generator": None, "chunk_size": 2}
    batched = mprt(gxi_factory, net, x, [0, 1, 2], **kwargs)
    single = [mprt(gxi_factory, net, x[i : i + 1], [i], **kwargs) for i in range(3)]
    torch.testing.assert_close(batched.similarity, torch.cat([s.similarity for s in single], dim=1))
    assert [m.training for m in net.modules()] == flags
    assert all(p.grad is None for p in net.parameters())


def test_bad_inputs() -> None:
    net = product_net()
    x = torch.rand(2, 1, 8)
    with pytest.raises(InvalidInputError, match="order"):
        mprt(weight_map, net, x, 0, order="sideways")
    with pytest.raises(camkit.LayerNotFoundError):
        mprt(weight_map, net, x, 0, layers=["9"])
    with pytest.raises(InvalidInputError, match=r"maps must be \[B, \*S\]"):
        mprt(weight_map, net, x, 0, layers=["1"], maps=torch.rand(2, 1, 7))
    with pytest.raises(InvalidInputError, match="or with a channel axis"):
        mprt(lambda m: lambda inputs, target: inputs[:, :, :7], net, x, 0, layers=["1"])
    with pytest.raises(InvalidInputError, match="off_classes"):
        random_logit(weight_map(net), net, x, [0, 1], off_classes=torch.tensor([0, 0]))


# ---- efficient MPRT -------------------------------------------------------------------------


def test_discrete_entropy_matches_numpy_histogram() -> None:
    maps = torch.rand(3, 6, 6, generator=torch.Generator().manual_seed(1))
    expected = [scipy_entropy(np.histogram(m.numpy(), bins=10)[0]) for m in maps]
    torch.testing.assert_close(discrete_entropy(maps, 10), torch.tensor(expected, dtype=torch.float32))


def test_efficient_mprt_by_hand() -> None:
    x = torch.rand(2, 1, 8, generator=torch.Generator().manual_seed(0))

    def factory(model):  # the map turns from two values into eight distinct ones once w1 is negative
        def explain(x, target):
            w = model[1].w.detach()
            return x[:, 0] if w < 0 else (x[:, 0] > 0.5).float()

        return explain

    score = efficient_mprt(factory, product_net(), x, 0, bins=8, layers=["1"], randomize=flip)
    before = discrete_entropy((x[:, 0] > 0.5).float(), 8)
    after = discrete_entropy(x[:, 0], 8)
    torch.testing.assert_close(score, (after - before) / before)


# ---- random logit ---------------------------------------------------------------------------


def test_random_logit_draws_another_class() -> None:
    net = RankNet(1, classes=4)
    x = rank_input(1, batch=3)
    maps_of: dict[int, torch.Tensor] = {}

    def explain(x, classes):
        return classes.float()[:, None].expand(-1, x.shape[-1]) + x[:, 0]

    def similarity(a, b):
        maps_of["diff"] = (b - a)[:, 0]
        return (b - a)[:, 0]

    random_logit(explain, net, x, [0, 3, 2], similarity=similarity, generator=torch.Generator().manual_seed(3))
    drawn = torch.randint(0, 3, (3,), generator=torch.Generator().manual_seed(3))
    off = drawn + (drawn >= torch.tensor([0, 3, 2])).long()
    torch.testing.assert_close(maps_of["diff"], (off - torch.tensor([0, 3, 2])).float())
    assert (off != torch.tensor([0, 3, 2])).all()


# ---- parity with Quantus 0.6.0 --------------------------------------------------------------

quantus = pytest.importorskip("quantus")


def quantus_layers(model: nn.Module, order: str) -> list[str]:
    names = [name for name, m in model.named_modules() if hasattr(m, "reset_parameters")]
    return names[::-1] if order == "top_down" else names


def quantus_randomize(seed: int):
    def randomize(module: nn.Module, generator: torch.Generator) -> None:
        torch.manual_seed(seed + 1)
        module.reset_parameters()

    return randomize


def _q_explain(model, inputs, targets, **kwargs):
    return grad_x_input(model, inputs, targets)[:, None].numpy()


def test_mprt_parity_and_quantus_averaging_in_the_unrandomised_layer() -> None:
    net = RankNet(2, classes=3).eval()  # Quantus expects a model in eval mode
    x = rank_input(2, batch=3)
    y = np.array([0, 2, 1])
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = quantus.MPRT(normalise=False, abs=False, disable_warnings=True)
        per_layer = metric(model=net, x_batch=x.numpy(), y_batch=y, explain_func=_q_explain, device="cpu")
        averaged = quantus.MPRT(normalise=False, abs=False, disable_warnings=True, return_average_correlation=True)(
            model=net, x_batch=x.numpy(), y_batch=y, explain_func=_q_explain, device="cpu"
        )
        ours = mprt(gxi_factory, net, x, torch.as_tensor(y), layers=quantus_layers(net, "top_down"),
                    randomize=quantus_randomize(42))  # fmt: skip
    expected = np.array([per_layer[name] for name in ours.layers])
    np.testing.assert_allclose(ours.similarity.numpy(), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.original.numpy(), per_layer["original"], atol=1e-5)
    # Quantus's average counts the 'original' self-check (similarity 1) as a layer
    n = len(ours.layers)
    np.testing.assert_allclose(averaged, (ours.average.numpy() * n + 1.0) / (n + 1), rtol=1e-4)
    assert (ours.average.numpy() < np.asarray(averaged)).all()


def test_efficient_mprt_parity() -> None:
    net = RankNet(2, classes=3).eval()  # Quantus expects a model in eval mode
    x = rank_input(2, batch=3)
    y = np.array([0, 2, 1])
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = quantus.EfficientMPRT(disable_warnings=True, complexity_func_kwargs={"n_bins": 12})
        theirs = metric(model=net, x_batch=x.numpy(), y_batch=y, explain_func=_q_explain, device="cpu")
        ours = efficient_mprt(gxi_factory, net, x, torch.as_tensor(y), bins=12,
                              layers=quantus_layers(net, "bottom_up"), randomize=quantus_randomize(42))  # fmt: skip
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-4)


def _quantus_ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Quantus's RandomLogit similarity: SSIM of the *flattened* maps, data range of the pair."""
    from skimage.metrics import structural_similarity

    out = []
    for p, q in zip(a.flatten(1).double().numpy(), b.flatten(1).double().numpy()):
        both = np.concatenate([p, q])
        out.append(structural_similarity(p, q, data_range=float(both.max() - both.min())))
    return torch.tensor(out)


def test_random_logit_parity_with_the_same_draw() -> None:
    net = RankNet(2, classes=5).eval()
    x = rank_input(2, batch=3)
    y = np.array([0, 4, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = quantus.RandomLogit(num_classes=5, normalise=False, disable_warnings=True)
        theirs = metric(model=net, x_batch=x.numpy(), y_batch=y, explain_func=_q_explain, device="cpu")
    np.random.seed(42)
    drawn = torch.as_tensor(np.random.randint(0, 4, 3))
    off = drawn + (drawn >= torch.as_tensor(y)).long()
    explain = gxi_factory(net)
    ours = random_logit(explain, net, x, torch.as_tensor(y), off_classes=off, similarity=_quantus_ssim)
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-4)
    # camkit's default compares the maps on their own grid, not as flattened rows
    on_grid = random_logit(explain, net, x, torch.as_tensor(y), off_classes=off,
                           similarity=lambda a, b: camkit.metrics.ssim(a, b, data_range=2.0))  # fmt: skip
    assert not np.allclose(on_grid.numpy(), theirs, atol=1e-3)
