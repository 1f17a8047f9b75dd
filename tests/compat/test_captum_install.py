"""camkit.compat.captum.install(), captum's module paths, and captum's calling contract (tuples, deltas, batching)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours
from camkit.compat.captum.attr import NotComputedError


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_install_aliases_captum_and_its_private_paths():
    done = _run(
        """
        import camkit.compat.captum as cc
        cc.install()
        import captum, captum.attr, captum.metrics
        from captum.attr import IntegratedGradients
        from captum.attr._core.integrated_gradients import IntegratedGradients as Private
        from captum.attr._core.layer.grad_cam import LayerGradCam
        from captum.metrics import infidelity
        from captum.testing.helpers.basic_models import BasicModel
        import camkit.compat.captum.attr as ours
        assert captum is cc and captum.attr is ours and Private is IntegratedGradients is ours.IntegratedGradients
        assert LayerGradCam is ours.LayerGradCam and infidelity.__module__ == "camkit.compat.captum.metrics"
        assert BasicModel.__module__ == "captum.testing.helpers.basic_models"  # test infrastructure: the original file
        try:
            from captum.attr._utils.batching import _batched_generator
        except ImportError as error:
            print("refused:", error)
        try:
            import captum.influence
        except ImportError as error:
            print("refused:", error)
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ok" in out
    assert "does not provide captum.attr._utils.batching._batched_generator" in out
    assert "captum.influence: camkit does not compute influence functions" in out


def test_install_refuses_when_captum_is_already_imported():
    done = _run(
        """
        import captum.attr
        import camkit.compat.captum as cc
        try:
            cc.install()
        except cc.AlreadyImportedError as error:
            print("refused:", error)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "refused: captum is already imported" in done.stdout
    assert "before the first 'import captum'" in done.stdout


def test_install_twice_is_harmless_and_uninstall_restores_the_original():
    done = _run(
        """
        import camkit.compat.captum as cc
        cc.install(); cc.install()
        import captum.attr
        assert captum.attr.Saliency.__module__.startswith("camkit.")
        cc.uninstall()
        import captum.attr
        print(captum.attr.Saliency.__module__)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "captum.attr._core.saliency"


class _TwoInputs(nn.Module):
    """f(a, b, scale) = (a * w) . 1 + (b ** 2) . 1, times a per-example scale."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))

    def forward(self, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, offset: float) -> torch.Tensor:
        out = ((a * self.w).sum(dim=1) + (b**2).flatten(1).sum(dim=1)) * scale[:, 0] + offset
        return torch.stack([out, -out], dim=1)


def test_tuple_inputs_additional_args_and_delta_by_formula():
    net = _TwoInputs()
    a = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], dtype=torch.float64)
    b = torch.tensor([[[1.0, 2.0]], [[-1.0, 0.5]]], dtype=torch.float64)
    scale = torch.tensor([[2.0], [3.0]], dtype=torch.float64)
    attr, delta = ours.IntegratedGradients(net).attribute(
        (a, b), target=0, additional_forward_args=(scale, 7.0), n_steps=8, return_convergence_delta=True
    )
    assert isinstance(attr, tuple) and attr[0].shape == a.shape and attr[1].shape == b.shape
    assert attr[0].dtype == attr[1].dtype == torch.float64
    # linear in a: IG = a * w * scale; quadratic in b: IG = b^2 * scale (Gauss-Legendre is exact for these;
    # camkit's IG sums the path in float32, hence the tolerance)
    torch.testing.assert_close(attr[0], a * net.w.detach() * scale, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(attr[1], b**2 * scale[:, :, None], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(delta, torch.zeros(2, dtype=torch.float64), atol=1e-5, rtol=0)
    # a tuple target indexes the output row; target 1 is the negated output
    neg = ours.IntegratedGradients(net).attribute((a, b), target=[(1,), (1,)], additional_forward_args=(scale, 7.0), n_steps=8)
    torch.testing.assert_close(neg[0], -attr[0])


def test_internal_batch_size_and_per_example_arguments_do_not_change_results():
    net = _TwoInputs()
    a = torch.randn(3, 3, dtype=torch.float64)
    b = torch.randn(3, 1, 2, dtype=torch.float64)
    scale = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    ig = ours.IntegratedGradients(net)
    whole = ig.attribute((a, b), target=0, additional_forward_args=(scale, 0.0), n_steps=6)
    chunked = ig.attribute((a, b), target=0, additional_forward_args=(scale, 0.0), n_steps=6, internal_batch_size=4)
    one = ig.attribute((a[1:2], b[1:2]), target=0, additional_forward_args=(scale[1:2], 0.0), n_steps=6)
    for w, c in zip(whole, chunked):
        torch.testing.assert_close(w, c)
    torch.testing.assert_close(whole[0][1:2], one[0])


def test_inputs_untouched_and_no_grads_left():
    net = nn.Sequential(nn.Linear(3, 2)).double()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    before = x.detach().clone()
    ours.Saliency(net).attribute(x, target=1)
    ours.DeepLift(net).attribute(x, target=0)
    assert torch.equal(x.detach(), before) and x.grad is None
    assert all(p.grad is None for p in net.parameters())
    assert not net._forward_hooks and not net[0]._forward_hooks and not net[0]._backward_hooks


def test_what_camkit_does_not_compute_is_refused():
    net = nn.Linear(3, 2)
    with pytest.raises(NotComputedError, match="DataLoaderAttribution"):
        ours.DataLoaderAttribution(net)
    with pytest.raises(NotComputedError, match="LLM attribution"):
        ours.LLMAttribution(net)
    with pytest.raises(NotComputedError, match="custom_attribution_func"):
        ours.DeepLiftShap(net).attribute(torch.rand(1, 3), torch.zeros(2, 3), target=0,
                                         custom_attribution_func=lambda m, i, b: m, return_convergence_delta=True)
    with pytest.raises(AssertionError, match="one tensor per input"):
        ours.DeepLift(net).attribute(torch.rand(1, 3), target=0, custom_attribution_func=lambda *a: a)
    with pytest.raises(AssertionError, match="Target not provided"):
        ours.Saliency(net).attribute(torch.rand(1, 3))


def test_deeplift_on_a_reused_relu_is_computed_where_captum_refuses():
    # captum raises for a model that calls one ReLU module twice; camkit's rule follows each call,
    # so the result equals the same network with two ReLU modules (which captum computes)
    torch.manual_seed(0)
    lin1, lin2 = nn.Linear(3, 2).double(), nn.Linear(2, 2).double()

    class Reused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin1, self.lin2, self.relu = lin1, lin2, nn.ReLU()

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.relu(self.lin2(self.relu(self.lin1(t))))

    twice = nn.Sequential(lin1, nn.ReLU(), lin2, nn.ReLU())
    x = torch.randn(4, 3, dtype=torch.float64)
    mine, delta = ours.DeepLift(Reused()).attribute(x, target=0, return_convergence_delta=True)
    ca = pytest.importorskip("captum.attr")
    torch.testing.assert_close(mine, ca.DeepLift(twice).attribute(x, target=0), atol=1e-6, rtol=1e-5)
    assert delta.abs().max() < 1e-6
    with pytest.raises(RuntimeError):
        ca.DeepLift(Reused()).attribute(x, target=0)
