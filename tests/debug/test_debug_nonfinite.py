import math

import pytest
import torch
from debug_helpers import NaNGradFn, Poison, SharedNet, hook_count
from models import TinyNet, tiny_input
from torch import nn

from camkit.debug import NonFiniteError, NonFiniteTracer, find_nonfinite


def _x(batch=2):
    return tiny_input(batch=batch, size=6)


def _finite_stats(t):
    finite = t[torch.isfinite(t)].double()
    return finite.min().item(), finite.max().item(), finite.mean().item()


def test_all_finite_gives_none_and_leaves_no_trace():
    model = SharedNet(Poison())
    x = _x()
    x0 = x.clone()
    assert find_nonfinite(model, x) is None
    assert hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(x, x0)


@pytest.mark.parametrize("call", [0, 1])
def test_forward_nan_reported_at_the_injected_module_and_call(call):
    model = SharedNet(Poison(forward_call=call))
    x = _x()
    event = find_nonfinite(model, x)
    assert (event.phase, event.name, event.type, event.call, event.where) == ("forward", "poison", "Poison", call, "output")
    assert (event.nan, event.posinf, event.neginf, event.numel, event.shape) == (1, 0, 0, 2 * 4 * 6 * 6, (2, 4, 6, 6))
    # the finite statistics are those of the clean output without entry 3 of sample 0
    clean = SharedNet(Poison())
    with torch.no_grad():
        out = clean.conv1(x)
        if call == 1:
            out = clean.conv2(out)
    out[0].view(-1)[3] = float("nan")
    lo, hi, mean = _finite_stats(out)
    assert event.finite_min == pytest.approx(lo, abs=1e-6)
    assert event.finite_max == pytest.approx(hi, abs=1e-6)
    assert event.finite_mean == pytest.approx(mean, abs=1e-6)
    assert "'poison'" in str(event) and f"(call {call})" in str(event)


def test_nan_from_functional_code_is_reported_at_the_next_modules_input():
    class LogNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def forward(self, x):
            return self.b(torch.log(self.a(x)))

    net = LogNet()
    with torch.no_grad():
        net.a.weight.copy_(torch.eye(2))
        net.a.bias.zero_()
    event = find_nonfinite(net, torch.tensor([[-1.0, 1.0]]))  # log(-1) = nan, log(1) = 0
    assert (event.name, event.where, event.nan, event.numel) == ("b", "input", 1, 2)


def test_input_and_overflow_infinities():
    event = find_nonfinite(TinyNet(), torch.full((1, 3, 8, 8), -math.inf))
    assert (event.name, event.where, event.neginf, event.numel) == ("", "input", 192, 192)
    assert math.isnan(event.finite_min)
    net = nn.Sequential(nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        net[0].weight.fill_(1.0)
    event = find_nonfinite(net, torch.tensor([[3e38, 3e38], [1.0, 2.0]]))
    assert (event.name, event.where, event.posinf, event.finite_max) == ("0", "output", 1, 3.0)


@pytest.mark.parametrize("call", [0, 1])
def test_backward_nan_reported_at_the_module_whose_backward_made_it(call):
    model = SharedNet(Poison(backward_call=call))
    event = find_nonfinite(model, _x())
    assert (event.phase, event.name, event.call, event.where) == ("backward", "poison", call, "grad_input")
    assert (event.nan, event.shape) == (1, (2, 4, 6, 6))


def test_backward_through_inplace_relu_after_the_poisoned_module():
    model = TinyNet()
    model.bn1 = nn.Sequential(model.bn1, Poison(backward_call=0))  # followed by ReLU(inplace=True)
    model.train()
    before = model.bn1[0].running_mean.clone()
    event = find_nonfinite(model, tiny_input())
    assert (event.name, event.where, event.call) == ("bn1.1", "grad_input", 0)
    assert torch.equal(model.bn1[0].running_mean, before)  # buffers restored after a training-mode forward
    assert all(m.training for m in model.modules())
    assert hook_count(model) == 0


def test_parameter_gradient_nan_is_reported_with_the_parameter_name():
    class BadWeightGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(w)
            return x * w

        @staticmethod
        def backward(ctx, grad):
            (w,) = ctx.saved_tensors
            return grad * w, torch.full_like(w, math.inf)

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return BadWeightGrad.apply(x, self.weight)

    net = nn.Sequential(nn.Linear(3, 3), Scale(), nn.Linear(3, 1))
    event = find_nonfinite(net, torch.randn(2, 3), target=lambda out: out.sum())
    assert (event.name, event.type, event.where, event.call, event.posinf) == ("1", "Scale", "param 1.weight", -1, 3)


def test_nonfinite_gradient_from_the_loss_is_grad_output_of_the_last_module():
    model = TinyNet()
    event = find_nonfinite(model, tiny_input(), target=lambda out: NaNGradFn.apply(out).sum())
    assert (event.name, event.where, event.shape, event.nan) == ("fc", "grad_output", (3, 5), 1)


def test_raising_mode_stops_in_forward_and_in_backward_and_cleans_up():
    model = SharedNet(Poison(forward_call=1))
    with pytest.raises(NonFiniteError) as info:
        find_nonfinite(model, _x(), raise_error=True)
    assert (info.value.event.name, info.value.event.call) == ("poison", 1)
    assert isinstance(info.value, FloatingPointError)
    assert hook_count(model) == 0

    model = SharedNet(Poison(backward_call=1))
    with NonFiniteTracer(model, raise_error=True) as tracer:
        out = model(_x())
        with pytest.raises(NonFiniteError) as info:
            out.sum().backward()
    assert (info.value.event.where, info.value.event.call) == ("grad_input", 1)
    assert tracer.backward_event == info.value.event
    assert hook_count(model) == 0


def test_tracer_over_training_steps_reports_the_step():
    model = SharedNet(Poison())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NonFiniteTracer(model) as tracer:
        for step in range(3):
            if step == 2:
                model.poison.forward_call = model.poison.calls + 1  # the second call of step 2
            loss = model(_x()).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    event = tracer.forward_event
    assert (event.step, event.name, event.call) == (2, "poison", 1)
    assert hook_count(model) == 0
