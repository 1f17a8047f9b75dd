"""DataParallel / DistributedDataParallel: the module runs on its own device, results come back home.

A CPU has one device, so the move is exercised with a stand-in: ``module_device`` says the
wrapped module lives on ``cuda:7`` and the one tensor move (``_placement._to``) is replaced
by a recording copy. The tests check that the module only ever sees the moved tensors and
that every tensor of the explanation went through the move back to the caller's device.
The CUDA tests do the real thing (skipped without a GPU).
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.distributed as dist
from factories import FACTORIES, NEEDS_VIT, method_params
from models import TinyNet
from torch import Tensor, nn

import camkit
from camkit.hooks import HookScope
from camkit.methods._core import placement as _placement

FAR = torch.device("cuda", 7)


class Mover:
    """Stands in for ``Tensor.to(device)``: a copy, remembered with where it was 'sent'."""

    def __init__(self) -> None:
        self.sent: dict[int, torch.device] = {}
        self.kept: list[Tensor] = []  # keeps the copies alive, so their ids stay theirs

    def __call__(self, tensor: Tensor, device: torch.device) -> Tensor:
        copy = tensor.clone()
        self.sent[id(copy)] = torch.device(device)
        self.kept.append(copy)
        return copy

    def where(self, tensor: Tensor) -> torch.device | None:
        return self.sent.get(id(tensor))


@pytest.fixture
def mover(monkeypatch):
    # DataParallel on a machine with one GPU moves its module there at construction; the stand-in
    # tests keep every module on the CPU and let the recorder play the device, on any machine.
    monkeypatch.setattr(importlib.import_module("torch.nn.parallel.data_parallel"), "_get_available_device_type", lambda: None)
    mover = Mover()
    monkeypatch.setattr(_placement, "module_device", lambda module: FAR)
    monkeypatch.setattr(_placement, "_to", mover)
    return mover


def _seen_inputs(module: nn.Module, seen: list):
    def hook(mod, args, kwargs):
        seen.append((args, kwargs))

    return hook


def build(key: str, wrapped: nn.Module, model: TinyNet) -> camkit.Explainer:
    """The shared factory on the wrapper (Ablation-CAM's tail reads the bare model's modules)."""
    if key == "ablationcam":
        return camkit.AblationCAM(
            wrapped, "conv2", batch_size=7, tail=lambda a: model.fc(torch.flatten(model.pool(model.relu2(a)), 1))
        )
    return FACTORIES[key](wrapped)


def _explanation_tensors(e: camkit.Explanation) -> list[Tensor]:
    raws = e.raw if isinstance(e.raw, tuple) else (e.raw,)
    out = [e.maps, *raws, e.scores, e.flat]
    out += [v for v in e.extras.values() if isinstance(v, Tensor)]
    return out + ([e.target] if e.target is not None else [])


def test_wrapped_module_sees_moved_inputs_and_results_come_home(mover):
    model = TinyNet().eval()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    bare = camkit.GradCAM(model, "conv2").explain(x, torch.tensor([0, 1, 2]))
    seen: list = []
    with HookScope() as hooks:
        hooks.forward_pre(model, _seen_inputs(model, seen), with_kwargs=True)
        got = camkit.GradCAM(nn.DataParallel(model), "conv2").explain(x, torch.tensor([0, 1, 2]))
    (args, _), = seen
    assert args[0] is not x and mover.where(args[0]) == FAR
    torch.testing.assert_close(args[0], x, atol=0, rtol=0)
    for tensor in _explanation_tensors(got):
        assert mover.where(tensor) == x.device
    torch.testing.assert_close(got.maps, bare.maps, atol=0, rtol=0)
    torch.testing.assert_close(got.scores, bare.scores, atol=0, rtol=0)


@pytest.mark.heavy
@pytest.mark.parametrize("key", method_params(sorted(FACTORIES)))
def test_every_method_returns_home(key, mover):
    model = TinyNet().eval()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    bare = FACTORIES[key](model).explain(x, [1, 3])
    got = build(key, nn.DataParallel(model), model).explain(x, [1, 3])
    assert all(mover.where(t) == x.device for t in _explanation_tensors(got))
    torch.testing.assert_close(got.maps, bare.maps, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ["timm", "torchvision"])
@pytest.mark.parametrize("key", sorted(NEEDS_VIT))
def test_attention_methods_return_home(key, family, mover):
    from vit_helpers import SIZE, timm_vit, torchvision_vit

    model = (timm_vit if family == "timm" else torchvision_vit)()
    x = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    bare = FACTORIES[key](model).explain(x, [1, 3])
    got = FACTORIES[key](nn.DataParallel(model)).explain(x, [1, 3])
    assert all(mover.where(t) == x.device for t in _explanation_tensors(got))
    torch.testing.assert_close(got.maps, bare.maps, atol=1e-6, rtol=1e-5)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, image: Tensor, mask: Tensor, scale: Tensor | None = None) -> Tensor:
        out = self.fc((self.conv(image) * mask).mean(dim=(2, 3)))
        return out if scale is None else out * scale


def test_all_inputs_move_and_x_stays_itself(mover):
    model = TwoInputs().eval()
    x = torch.rand(2, 3, 8, 8)
    mask = (torch.rand(2, 1, 8, 8) > 0.3).float()
    scale = torch.tensor([2.0, 0.5, 1.0])
    seen: list = []
    with HookScope() as hooks:
        hooks.forward_pre(model, _seen_inputs(model, seen), with_kwargs=True)
        got = camkit.GradCAM(nn.DataParallel(model), "conv").explain(x, 1, inputs=(x, mask), kwargs={"scale": scale})
    (args, kwargs), = seen
    assert [mover.where(a) for a in args] == [FAR, FAR] and mover.where(kwargs["scale"]) == FAR
    bare = camkit.GradCAM(model, "conv").explain(x, 1, inputs=(x, mask), kwargs={"scale": scale})
    torch.testing.assert_close(got.maps, bare.maps, atol=0, rtol=0)


def test_bare_modules_and_same_device_wrappers_are_not_moved(mover, monkeypatch):
    model = TinyNet().eval()
    x = torch.rand(2, 3, 8, 8)
    camkit.GradCAM(model, "conv2").explain(x)
    assert mover.sent == {}
    monkeypatch.setattr(_placement, "module_device", lambda module: x.device)
    camkit.GradCAM(nn.DataParallel(model), "conv2").explain(x)
    assert mover.sent == {}


def test_wrappers_of_explainers_come_home(mover):
    model = TinyNet().eval()
    x = torch.rand(2, 3, 8, 8)
    smooth = camkit.SmoothGrad(camkit.GradCAM(nn.DataParallel(model), "conv2"), samples=2, seed=0)
    got = smooth.explain(x, [0, 1])
    # (On a real device the inner calls find their images on the module's device and move nothing;
    # the stand-in's copies stay on the CPU, so here they are moved again: no count is checked.)
    assert FAR in mover.sent.values()
    assert mover.where(got.maps) == x.device
    bare = camkit.SmoothGrad(camkit.GradCAM(model, "conv2"), samples=2, seed=0).explain(x, [0, 1])
    torch.testing.assert_close(got.maps, bare.maps, atol=0, rtol=0)


def test_module_device_reads_parameters_then_buffers():
    assert _placement.module_device(nn.Linear(2, 2)) == torch.device("cpu")
    assert _placement.module_device(nn.BatchNorm2d(2, affine=False)) == torch.device("cpu")
    assert _placement.module_device(nn.ReLU()) is None


def test_distributed_data_parallel_on_cpu(tmp_path):
    """A one-process gloo group: DDP-wrapped maps are the bare module's."""
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = TinyNet().eval()
        x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
        wrapped = nn.parallel.DistributedDataParallel(model)
        got = camkit.GradCAM(wrapped, "module.conv2").explain(x, [0, 4])
        bare = camkit.GradCAM(model, "conv2").explain(x, [0, 4])
        torch.testing.assert_close(got.maps, bare.maps, atol=0, rtol=0)
    finally:
        if started:
            dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("key", ["gradcam", "scorecam", "saliency", "integratedgradients", "guidedgradcam"])
def test_cuda_data_parallel_takes_cpu_inputs(key):
    model = TinyNet().cuda().eval()
    x = torch.rand(2, 3, 8, 8)
    got = build(key, nn.DataParallel(model), model).explain(x, torch.tensor([1, 3]))
    assert all(t.device.type == "cpu" for t in _explanation_tensors(got))
    bare = FACTORIES[key](model).explain(x.cuda(), torch.tensor([1, 3], device="cuda"))
    torch.testing.assert_close(got.maps, bare.maps.cpu(), atol=1e-5, rtol=1e-4)
