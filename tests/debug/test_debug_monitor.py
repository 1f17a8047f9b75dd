import csv
import math
import sys

import numpy as np
import pytest
import torch
from debug_helpers import hook_count
from models import TinyNet, tiny_input
from torch import nn

from camkit import read_rgb
from camkit.debug import ActivationMonitor, GradientMonitor, MissingDependencyError
from camkit.debug.plot import PALETTE


def _dead_tinynet():
    model = TinyNet()
    with torch.no_grad():
        model.conv1.weight[1].zero_()
        model.conv1.bias[1] = -100.0  # bn1 -> relu: channel 1 is always 0 (a dead unit)
    model.eval()
    return model


def _expected_activation(y, kind=None, eps=0.01):
    y = y.double()
    mean = y.sum() / y.numel()
    std = (((y - mean) ** 2).sum() / y.numel()).sqrt()
    zeros = (y == 0).double().sum() / y.numel()
    dead = sum(bool((y[:, c] == 0).all()) for c in range(y.shape[1])) / y.shape[1]
    if kind == "sigmoid":
        sat = ((y < eps) | (y > 1 - eps)).double().mean().item()
    elif kind == "tanh":
        sat = (y.abs() > 1 - eps).double().mean().item()
    else:
        sat = math.nan
    return [mean.item(), std.item(), y.min().item(), y.max().item(), zeros.item(), dead, sat]


def _close(got, expected, tol=1e-5):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (math.isnan(g) and math.isnan(e)) or g == pytest.approx(e, rel=tol, abs=tol), (got, expected)


def test_activation_monitor_values_equal_manual_computation_every_k_steps():
    model = _dead_tinynet()
    inputs = [tiny_input(seed=s) for s in range(5)]
    with ActivationMonitor(model, ["bn1", "relu", "fc"], every=2) as monitor:
        for x in inputs:
            model(x)
            monitor.step()
    assert hook_count(model) == 0
    keys, values = monitor.values()
    assert keys == [(s, n, 0) for s in (0, 2, 4) for n in ("bn1", "relu", "fc")]
    assert values.dtype == torch.float64 and values.device.type == "cpu"
    for row, (step, name, _) in zip(values.tolist(), keys):
        x = inputs[step]
        with torch.no_grad():
            bn = model.bn1(model.conv1(x))
            expected = {"bn1": bn, "relu": torch.relu(bn), "fc": model.fc(model.pool(torch.relu(model.conv2(torch.relu(bn)))).flatten(1))}
        _close(row, _expected_activation(expected[name]))
    # bn1's output is recorded before the in-place ReLU changes it: it has negatives
    assert monitor.series("bn1", "min")[1][0] < 0
    assert monitor.series("relu", "dead") == ([0, 2, 4], [0.25, 0.25, 0.25])
    assert monitor.series("fc", "dead")[1][0] == 0.0


def test_saturation_for_sigmoid_and_tanh_and_calls_of_a_shared_module():
    pre = torch.tensor([[-10.0, 0.0, 10.0, 5.0], [-3.0, 0.1, 3.0, 2.0]])
    sig, tanh = nn.Sigmoid(), nn.Tanh()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.sig, self.tanh = sig, tanh

        def forward(self, x):
            return self.tanh(self.sig(x[:1])), self.tanh(x[1:])

    net = Net()
    with ActivationMonitor(net, ["sig", "tanh"], every=1) as monitor:
        net(pre)
        monitor.step()
    rows = {(r["layer"], r["call"]): r for r in monitor.rows()}
    # sigmoid(-10) < 0.01, sigmoid(0) = 0.5, sigmoid(10) > 0.99, sigmoid(5) = 0.9933 > 0.99 -> 3/4
    assert rows[("sig", 0)]["saturation"] == 0.75
    # tanh of [-3, 0.1, 3, 2]: |tanh(3)| = 0.99505 > 0.99, tanh(2) = 0.964 -> 2/4
    assert rows[("tanh", 1)]["saturation"] == 0.5
    _close(list(rows[("tanh", 1)].values())[3:], _expected_activation(torch.tanh(pre[1:]), "tanh"))
    assert sorted(rows) == [("sig", 0), ("tanh", 0), ("tanh", 1)]


def test_gradient_monitor_values_equal_manual_autograd():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    # the manual computation first, on the same weights
    h = net[0](x)
    out = net[2](torch.relu(h))
    loss = (out**2).sum()
    g_h, g_w0, g_b0, g_w2, g_b2 = torch.autograd.grad(loss, [h, net[0].weight, net[0].bias, net[2].weight, net[2].bias])
    g_out = 2 * out.detach().double()
    middle = (g_h.double().norm().item() + g_out.norm().item()) / 2  # one layer's norm below, the other's above
    with GradientMonitor(net, ["0", "2"], every=3, vanishing_below=middle, exploding_above=middle) as monitor:
        for _ in range(4):
            (net(x) ** 2).sum().backward()
            monitor.step()
    assert hook_count(net) == 0
    rows = monitor.rows()
    assert [(r["step"], r["layer"]) for r in rows] == [(0, "2"), (0, "0"), (3, "2"), (3, "0")]
    # no optimizer step, so both sampled steps see the same gradients
    row0 = rows[1]
    g = g_h.double()
    _close(
        [row0["norm"], row0["mean"], row0["std"], row0["max_abs"], row0["param_norm"]],
        [g.norm().item(), g.mean().item(), g.std(correction=0).item(), g.abs().max().item(),
         math.sqrt(g_w0.double().pow(2).sum().item() + g_b0.double().pow(2).sum().item())],
    )
    small, large = (rows[1], rows[0]) if g.norm() < g_out.norm() else (rows[0], rows[1])
    assert (small["vanishing"], small["exploding"], large["vanishing"], large["exploding"]) == (1.0, 0.0, 0.0, 1.0)
    assert rows[0]["norm"] == pytest.approx(g_out.norm().item(), rel=1e-5)
    assert rows[0]["param_norm"] == pytest.approx(
        math.sqrt(g_w2.double().pow(2).sum().item() + g_b2.double().pow(2).sum().item()), rel=1e-5
    )
    assert rows[2] == {**rows[0], "step": 3}


def test_gradient_monitor_does_not_change_param_grad_and_flags_vanishing():
    model = TinyNet()
    x = tiny_input()
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with GradientMonitor(model, every=1, vanishing_below=1e9) as monitor:
        model(x).sum().backward()
        monitor.step()
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected))
    assert {r["vanishing"] for r in monitor.rows()} == {1.0}
    assert math.isnan(next(r for r in monitor.rows() if r["layer"] == "relu")["param_norm"])


def test_csv_reads_back_exactly(tmp_path):
    model = _dead_tinynet()
    with ActivationMonitor(model, ["conv2", "relu"], every=1) as monitor:
        for s in range(2):
            model(tiny_input(seed=s))
            monitor.step()
    path = monitor.to_csv(tmp_path / "sub" / "acts.csv")
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["step", "layer", "call", "mean", "std", "min", "max", "zeros", "dead", "saturation"]
    expected = monitor.rows()
    assert len(rows) == len(expected) == 4
    for got, want in zip(rows, expected):
        assert (int(got["step"]), got["layer"], int(got["call"])) == (want["step"], want["layer"], want["call"])
        for stat in ActivationMonitor.STATS:
            value = float(got[stat])
            assert value == want[stat] or (math.isnan(value) and math.isnan(want[stat]))


def test_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = TinyNet()
    with GradientMonitor(model, ["conv2", "fc"], every=2) as monitor:
        for _ in range(3):
            model(tiny_input()).sum().backward()
            monitor.step()
    monitor.to_tensorboard(tmp_path / "tb")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "gradients/conv2/norm" in tags and "gradients/fc/param_norm" in tags
    events = acc.Scalars("gradients/fc/norm")
    steps, values = monitor.series("fc", "norm")
    assert [e.step for e in events] == steps == [0, 2]
    assert [e.value for e in events] == pytest.approx(values, rel=1e-6)


def test_tensorboard_missing_raises_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monitor = ActivationMonitor(TinyNet(), ["fc"], every=1)
    with pytest.raises(MissingDependencyError, match="pip install tensorboard"):
        monitor.to_tensorboard(tmp_path / "tb")
    assert isinstance(MissingDependencyError("x"), ImportError)


def test_plot_png_has_the_series_colours(tmp_path):
    model = _dead_tinynet()
    with ActivationMonitor(model, ["conv1", "conv2"], every=1) as monitor:
        for s in range(4):
            model(tiny_input(seed=s))
            monitor.step()
    image = monitor.plot(tmp_path / "acts.png", stats=["mean", "max"])
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert np.array_equal(read_rgb(tmp_path / "acts.png"), image)
    for colour in PALETTE[:2]:  # one line per layer, in palette order
        assert np.all(image == np.array(colour, np.uint8), axis=2).sum() > 20
    assert not np.all(image == np.array(PALETTE[2], np.uint8), axis=2).any()
    with pytest.raises(ValueError, match="unknown statistic"):
        monitor.plot(stats=["median"])


def test_rejects_bad_every_and_unknown_layer():
    with pytest.raises(ValueError, match="positive int"):
        ActivationMonitor(TinyNet(), every=0)
    with pytest.raises(KeyError, match="conv3"):
        GradientMonitor(TinyNet(), ["conv3"])


def test_hooks_removed_after_exception_and_values_kept():
    model = TinyNet()
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"), ActivationMonitor(model, ["conv1"], every=1) as monitor:
        model(tiny_input())
    assert hook_count(model) == 0
    assert [r["layer"] for r in monitor.rows()] == ["conv1"]


def test_activation_stats_of_a_conv_output_by_hand():
    import math

    from camkit.debug.monitor import activation_stats

    # [B=2, C=3, 2, 2]: channel 0 all zero (dead), channel 1 has one zero, channel 2 none
    y = torch.zeros(2, 3, 2, 2)
    y[:, 1] = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    y[:, 2] = torch.tensor([[-1.0, 4.0], [5.0, 6.0]])
    mean, std, lo, hi, zeros, dead, saturation = activation_stats(y).tolist()
    values = [0.0] * 4 + [0.0, 1.0, 2.0, 3.0] + [-1.0, 4.0, 5.0, 6.0]
    expected_mean = sum(values) / 12
    assert mean == pytest.approx(expected_mean)
    assert std == pytest.approx(math.sqrt(sum((v - expected_mean) ** 2 for v in values) / 12))
    assert (lo, hi) == (-1.0, 6.0)
    assert zeros == pytest.approx(5 / 12) and dead == pytest.approx(1 / 3) and math.isnan(saturation)


def test_gradient_monitor_statistics_by_hand():
    from torch import nn

    from camkit.debug import GradientMonitor

    net = nn.Sequential(nn.Linear(2, 3, bias=False))
    weights = torch.tensor([1.0, -4.0, 2.0])
    with GradientMonitor(net, ["0"], every=1) as monitor:
        (net(torch.ones(2, 2)) * weights).sum().backward()  # the output's gradient: [[1, -4, 2]] * 2 rows
        monitor.step()
    row = monitor.rows()[0]
    values = [1.0, -4.0, 2.0] * 2
    mean = sum(values) / 6
    assert row["mean"] == pytest.approx(mean) and row["max_abs"] == pytest.approx(4.0)
    assert row["std"] == pytest.approx((sum((v - mean) ** 2 for v in values) / 6) ** 0.5)
    assert row["norm"] == pytest.approx(sum(v * v for v in values) ** 0.5)
    for p in net.parameters():
        p.grad = None
