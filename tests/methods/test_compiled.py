"""The compiled path of the gradient CAMs (``compile=True``): a call captured once per input shape and replayed.

On a GPU the capture is a CUDA graph (the CUDA tests below). On the CPU the same path runs with a
stand-in for the graph: the capture runs the step once under the sync recorder with camkit's
device paths (any host sync raises, as it makes a CUDA capture fail) and a replay runs the step
again into the captured outputs. That checks what the explainer adds around the graph: which calls
are captured, one capture per shape, the outputs copied out, the fallback and its warning, host
classes checked, the model left as it was.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from models import ResBlockNet, TinyNet, tiny_input
from torch import Tensor, nn

import camkit
from camkit._internal import syncs as _syncs
from camkit._internal.syncs import record_syncs
from camkit.methods._core import replay

METHODS = [camkit.GradCAM, camkit.GradCAMPlusPlus, camkit.XGradCAM, camkit.LayerCAM, camkit.HiResCAM]


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


class Replays:
    """A stand-in for CUDA graphs on the CPU: counts captures and replays."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def capture(self, step, inputs):
        static = [t.detach().clone() for t in inputs]
        step(*static)  # the warm-up
        with record_syncs() as syncs:
            outputs = [out.detach() for out in step(*static)]
        if syncs:
            raise RuntimeError(f"operation not permitted when stream is capturing ({syncs[0]})")
        self.captures += 1

        def run() -> None:
            self.replays += 1
            for out, fresh in zip(outputs, step(*static)):
                out.copy_(fresh)

        return replay.Captured(static, outputs, run, None)


@pytest.fixture
def graphs(monkeypatch):
    """The CPU taken for a device that captures, with camkit's device paths and the stand-in graphs."""
    stand_in = Replays()
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    monkeypatch.setattr(replay, "can_capture", lambda device: True)
    monkeypatch.setattr(replay, "capture_graph", stand_in.capture)
    return stand_in


class HostBranch(TinyNet):
    """A forward that reads a value on the host: no graph can hold it."""

    def forward(self, x: Tensor) -> Tensor:
        if x.mean() > 2:  # a host read of a device value
            x = x * 2
        return super().forward(x)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.__name__)
def test_replays_give_the_eager_maps(method, graphs):
    model = TinyNet().eval()
    eager = method(model, "conv2")
    compiled = method(model, "conv2", compile=True)
    x1, x2 = tiny_input(batch=3, seed=1), tiny_input(batch=3, seed=2)
    target = torch.tensor([0, 3, 1])
    for x in (x1, x2, x1):
        want, got = eager.explain(x, target), compiled.explain(x, target)
        torch.testing.assert_close(got.maps, want.maps, rtol=0, atol=0)
        torch.testing.assert_close(got.raw, want.raw, rtol=0, atol=0)
        torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=0)
        assert torch.equal(got.flat, want.flat) and torch.equal(got.target, want.target)
        assert got.method == want.method and got.layers == want.layers
    assert (graphs.captures, graphs.replays) == (1, 3)


def test_outputs_are_the_callers_not_the_graphs(graphs):
    explainer = camkit.GradCAM(TinyNet().eval(), "conv2", compile=True)
    first = explainer.explain(tiny_input(seed=1), [0, 1, 2])
    kept = first.maps.clone()
    explainer.explain(tiny_input(seed=2), [0, 1, 2])
    assert torch.equal(first.maps, kept)


def test_a_new_shape_or_target_kind_captures_again(graphs):
    model = TinyNet().eval()
    explainer = camkit.GradCAM(model, "conv2", compile=True)
    eager = camkit.GradCAM(model, "conv2")
    for batch in (2, 3, 2):
        x = tiny_input(batch=batch)
        torch.testing.assert_close(explainer(x), eager(x), rtol=0, atol=0)  # top-1
        torch.testing.assert_close(explainer(x, 1), eager(x, 1), rtol=0, atol=0)  # an int: given classes
    x = tiny_input(batch=2, size=12)
    torch.testing.assert_close(explainer(x, 4), eager(x, 4), rtol=0, atol=0)
    assert graphs.captures == 5 and len(explainer._graphs) == 4  # the oldest of five dropped


def test_new_weights_capture_again(graphs):
    model = TinyNet().eval()
    explainer = camkit.GradCAM(model, "conv2", compile=True)
    x = tiny_input()
    explainer(x, 0)
    model.fc.weight = nn.Parameter(model.fc.weight.detach() * -1)  # a replaced parameter: new memory
    torch.testing.assert_close(explainer(x, 0), camkit.GradCAM(model, "conv2")(x, 0), rtol=0, atol=0)
    assert graphs.captures == 2


def test_calls_it_cannot_capture_run_eagerly(graphs):
    model = TinyNet().eval()
    explainer = camkit.GradCAM(model, "conv2", compile=True)
    eager = camkit.GradCAM(model, "conv2")
    x = tiny_input(batch=2)
    for target in (torch.tensor([[0, 1], [2, 3]]), lambda out: out[:, 2]):
        torch.testing.assert_close(explainer(x, target), eager(x, target), rtol=0, atol=0)
    with_inputs = explainer.explain(x, 0, inputs=(x,))
    torch.testing.assert_close(with_inputs.maps, eager(x, 0), rtol=0, atol=0)
    kept = camkit.GradCAM(model, "conv2", compile=True, keep_mode=True)
    torch.testing.assert_close(kept(x, 0), eager(x, 0), rtol=0, atol=0)
    assert graphs.captures == 0


def test_a_model_that_cannot_be_captured_warns_once_and_runs_eagerly(graphs):
    model = HostBranch().eval()
    explainer = camkit.GradCAM(model, "conv2", compile=True)
    x = tiny_input(batch=2)
    with pytest.warns(camkit.CaptureWarning, match=r"could not capture .*\[2, 3, 8, 8\].*_local_scalar_dense"):
        maps = explainer(x, [1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call of that shape: no warning
        again = explainer(x, [1, 2])
    want = camkit.GradCAM(model, "conv2")(x, [1, 2])
    torch.testing.assert_close(maps, want, rtol=0, atol=0)
    torch.testing.assert_close(again, want, rtol=0, atol=0)
    assert graphs.captures == 0 and _hooks(model) == 0


def test_host_classes_are_checked_as_on_the_eager_path(graphs):
    explainer = camkit.GradCAM(TinyNet(classes=5).eval(), "conv2", compile=True)
    x = tiny_input(batch=2)
    explainer(x, [0, 1])
    for bad in ([0, 5], [-1, 0], 7):
        with pytest.raises(camkit.InvalidTargetError, match="out of range for an output with 5 classes"):
            explainer(x, bad)


def test_the_model_is_left_as_it_was(graphs):
    model = ResBlockNet().train()
    model.bn1.eval()
    flags = [m.training for m in model.modules()]
    grads = [p.requires_grad for p in model.parameters()]
    stats = model.bn2.running_mean.clone()
    x = tiny_input(batch=2)
    before = x.clone()
    explainer = camkit.LayerCAM(model, "bn2", compile=True)
    for _ in range(3):
        explainer(x, [0, 1])
    assert graphs.captures == 1 and graphs.replays == 3
    assert [m.training for m in model.modules()] == flags
    assert [p.requires_grad for p in model.parameters()] == grads
    assert all(p.grad is None for p in model.parameters())
    assert _hooks(model) == 0 and torch.equal(model.bn2.running_mean, stats) and torch.equal(x, before)


def test_no_host_sync_on_the_replay(graphs):
    explainer = camkit.GradCAMPlusPlus(TinyNet().eval(), "conv2", compile=True)
    x, target = tiny_input(), torch.tensor([0, 1, 2])
    explainer.explain(x, target)
    with record_syncs() as syncs:
        explainer.explain(x, target)
    assert [str(s) for s in syncs] == []


def test_a_copy_starts_without_the_originals_captures(graphs):
    import copy
    import pickle

    explainer = camkit.GradCAM(TinyNet().eval(), "conv2", compile=True)
    x = tiny_input()
    explainer(x, 0)
    twin = copy.deepcopy(explainer)
    assert twin.compile and len(twin._graphs) == 0 and len(explainer._graphs) == 1
    torch.testing.assert_close(twin(x, 0), explainer(x, 0), rtol=0, atol=0)
    assert len(pickle.loads(pickle.dumps(explainer))._graphs) == 0


def test_on_the_cpu_compile_is_the_eager_path():
    model = TinyNet().eval()
    x = tiny_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = camkit.GradCAM(model, "conv2", compile=True).explain(x, [0, 1, 2])
    torch.testing.assert_close(got.maps, camkit.GradCAM(model, "conv2")(x, [0, 1, 2]), rtol=0, atol=0)


def test_methods_without_a_compiled_path_refuse_it():
    with pytest.raises(camkit.InvalidInputError, match="ShapleyCAM has no compiled path"):
        camkit.ShapleyCAM(TinyNet(), "conv2", compile=True)


# --- CUDA: the real graphs ---------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.__name__)
def test_cuda_graph_replays_give_the_eager_maps(method):
    model = ResBlockNet().cuda().eval()
    eager = method(model, "bn2")
    compiled = method(model, "bn2", compile=True)
    for batch, seed in ((2, 1), (2, 2), (3, 3), (2, 4)):
        x = tiny_input(batch=batch, seed=seed).cuda()
        target = torch.arange(batch, device="cuda") % 4
        want, got = eager.explain(x, target), compiled.explain(x, target)
        torch.testing.assert_close(got.maps, want.maps, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.scores, want.scores)
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)  # top-1
    assert len(compiled._graphs) == 4  # two shapes, two target kinds
    assert _hooks(model) == 0 and all(p.grad is None for p in model.parameters())


@pytest.mark.cuda
@cuda
def test_cuda_graph_replay_makes_no_host_sync():
    explainer = camkit.GradCAM(TinyNet().cuda().eval(), "conv2", compile=True)
    x, target = torch.rand(3, 3, 8, 8, device="cuda"), torch.tensor([0, 1, 2], device="cuda")
    explainer.explain(x, target)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        explanation = explainer.explain(x, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(explainer._graphs) == 1 and explanation.maps.shape == (3, 8, 8)


@pytest.mark.cuda
@cuda
def test_cuda_model_that_cannot_be_captured_warns_and_runs_eagerly():
    model = HostBranch().cuda().eval()
    x = torch.rand(2, 3, 8, 8, device="cuda")
    explainer = camkit.GradCAM(model, "conv2", compile=True)
    with pytest.warns(camkit.CaptureWarning, match="could not capture"):
        maps = explainer(x, [1, 2])
    torch.testing.assert_close(maps, camkit.GradCAM(model, "conv2")(x, [1, 2]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(explainer(x, [1, 2]), maps)  # eager again, no second warning needed
    assert len(explainer._graphs) == 0 and _hooks(model) == 0
