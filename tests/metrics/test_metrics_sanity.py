"""Randomisation check on a tiny model trained on synthetic data; Spearman and SSIM helpers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from skimage.metrics import structural_similarity
from torch import nn

import camkit
from camkit.errors import InvalidInputError, LayerNotFoundError
from camkit.metrics import pointing_game, randomization_check, spearman, ssim


class SquareNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(x.amax(dim=(2, 3)))


def squares(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """16x16 noise with a 4x4 square anywhere: class 0 bright (+1), class 1 dark (-1); boxes [n, 4]."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    x = 0.1 * torch.randn(n, 1, 16, 16, generator=g)
    cols = torch.randint(0, 12, (n,), generator=g)
    rows = torch.randint(0, 12, (n,), generator=g)
    for i in range(n):
        x[i, 0, rows[i] : rows[i] + 4, cols[i] : cols[i] + 4] += 1.0 - 2.0 * labels[i]
    return x, labels, torch.stack([cols, rows, cols + 4, rows + 4], dim=1)


@pytest.fixture(scope="module")
def trained():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only add overhead
    torch.manual_seed(0)
    net = SquareNet()
    x, y, _ = squares(64, seed=1)
    opt = torch.optim.Adam(net.parameters(), lr=0.03)
    for _ in range(30):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    net.zero_grad(set_to_none=True)
    torch.set_num_threads(threads)
    return net


def test_gradcam_similarity_falls_as_layers_are_randomised(trained):
    x, y, boxes = squares(16, seed=7)
    with torch.no_grad():
        assert (trained(x).argmax(1) == y).float().mean() > 0.9  # the model learned the task
    maps = camkit.GradCAM(trained, "conv2")(x, y)
    assert pointing_game(maps, boxes, tolerance=1).float().mean() > 0.8  # and Grad-CAM finds the square

    state = {k: v.clone() for k, v in trained.state_dict().items()}
    trained.train()
    res = randomization_check(lambda m: camkit.GradCAM(m, "conv2"), trained, x, y)
    assert res.layers == ("original", "fc", "conv2", "conv1")
    # a random model's Grad-CAM can be all zero (ReLU): its correlation is NaN, left out here
    rho, sim = res.spearman.nanmean(dim=1), res.ssim.mean(dim=1)
    assert rho[0] > 0.999 and sim[0] > 0.999  # the untouched copy explains the same
    assert (rho[1:] < 0.6).all() and (sim[1:] < 0.5).all()  # every randomised step: far from the original
    assert rho[-1] < 0.5 and sim[-1] < 0.5  # fully random: unrelated maps
    assert res.spearman.shape == res.ssim.shape == (4, 16) and res.maps is None
    # the caller's model is untouched
    assert trained.training and all(torch.equal(state[k], v) for k, v in trained.state_dict().items())
    assert all(p.grad is None for p in trained.parameters())


def test_independent_order_layers_and_keep_maps(trained):
    x, y, _ = squares(4, seed=3)
    cascade = randomization_check(lambda m: camkit.GradCAM(m, "conv2"), trained, x, y, layers=["fc", "conv2"])
    single = randomization_check(
        lambda m: camkit.GradCAM(m, "conv2"), trained, x, y, order="independent", layers=["fc", "conv2"], keep_maps=True
    )
    assert cascade.layers == single.layers == ("original", "fc", "conv2")
    # step 1 randomises fc in both orders (same seed, same draws)
    assert torch.allclose(cascade.spearman[1], single.spearman[1], equal_nan=True)
    assert single.maps is not None and single.maps.shape == (3, 4, 16, 16)
    # independent step 2 randomises conv2 only: fc keeps its trained weights, so the maps differ from the cascade's
    assert not torch.allclose(cascade.spearman[2], single.spearman[2], equal_nan=True)
    with pytest.raises(LayerNotFoundError, match="conv9"):
        randomization_check(lambda m: camkit.GradCAM(m, "conv2"), trained, x, layers=["conv9"])
    with pytest.raises(InvalidInputError, match="top-down"):
        randomization_check(lambda m: camkit.GradCAM(m, "conv2"), trained, x, order="bottom-up")


def test_spearman_hand_values_and_scipy_parity():
    a = torch.tensor([[1.0, 1.0, 2.0]])
    b = torch.tensor([[1.0, 2.0, 3.0]])
    # average ranks (0.5, 0.5, 2) vs (0, 1, 2): covariance 1.5 over sqrt(1.5 * 2)
    assert spearman(a, b).item() == pytest.approx(1.5 / 3**0.5, abs=1e-6)
    assert torch.isnan(spearman(torch.ones(1, 3), b)).all()  # a constant map has no ranking
    g = torch.Generator().manual_seed(0)
    u = torch.randint(0, 4, (3, 5, 6), generator=g).float()  # many ties
    v = torch.rand(3, 5, 6, generator=g)
    ours = spearman(u, v)
    ref = [spearmanr(u[i].flatten().numpy(), v[i].flatten().numpy())[0] for i in range(3)]
    assert ours.tolist() == pytest.approx(ref, abs=1e-6)


def test_ssim_matches_scikit_image():
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(2, 9, 8, generator=g), torch.rand(2, 9, 8, generator=g)
    ref = [structural_similarity(a[i].double().numpy(), b[i].double().numpy(), data_range=1.0, win_size=7) for i in range(2)]
    assert ssim(a, b).tolist() == pytest.approx(ref, abs=1e-6)
    small = torch.rand(1, 5, 4, generator=g)
    expected = structural_similarity(small[0].double().numpy(), np.zeros((5, 4)), data_range=1.0, win_size=3)
    assert ssim(small, torch.zeros(1, 5, 4)).item() == pytest.approx(expected, abs=1e-6)
