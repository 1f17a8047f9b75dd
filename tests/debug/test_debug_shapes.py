import io
from contextlib import redirect_stdout

import torch
from debug_helpers import hook_count
from models import ResBlockNet, TinyNet, tiny_input
from torch import nn

from camkit.cli import main
from camkit.debug import trace_shapes


def test_tinynet_table_matches_hand_count():
    model = TinyNet()
    model.train()
    table = trace_shapes(model, tiny_input(batch=2))
    got = [(r.order, r.name, r.type, r.call, r.depth, r.input_shapes, r.output_shapes, r.params) for r in table]
    # conv1: 3*4*3*3 + 4 = 112; bn1: 4 + 4 = 8; conv2: 4*6*3*3 + 6 = 222; fc: 6*5 + 5 = 35; total 377.
    assert got == [
        (0, "", "TinyNet", 0, 0, ((2, 3, 8, 8),), ((2, 5),), 377),
        (1, "conv1", "Conv2d", 0, 1, ((2, 3, 8, 8),), ((2, 4, 8, 8),), 112),
        (2, "bn1", "BatchNorm2d", 0, 1, ((2, 4, 8, 8),), ((2, 4, 8, 8),), 8),
        (3, "relu", "ReLU", 0, 1, ((2, 4, 8, 8),), ((2, 4, 8, 8),), 0),
        (4, "conv2", "Conv2d", 0, 1, ((2, 4, 8, 8),), ((2, 6, 8, 8),), 222),
        (5, "relu2", "ReLU", 0, 1, ((2, 6, 8, 8),), ((2, 6, 8, 8),), 0),
        (6, "pool", "AdaptiveAvgPool2d", 0, 1, ((2, 6, 8, 8),), ((2, 6, 1, 1),), 0),
        (7, "fc", "Linear", 0, 1, ((2, 6),), ((2, 5),), 35),
    ]
    assert table.total_params == 377
    assert all(r.input_dtypes == ("float32",) and r.output_dtypes == ("float32",) for r in table)
    # hygiene: no hooks left, the caller's training flags kept, BN statistics untouched
    assert hook_count(model) == 0
    assert all(m.training for m in model.modules())
    assert torch.equal(model.bn1.running_mean, TinyNet().bn1.running_mean)


def test_modules_called_twice_appear_per_call_with_nesting_and_dtypes():
    relu = nn.ReLU()
    inner = nn.Sequential(nn.Linear(4, 4), relu)
    net = nn.Sequential(inner, relu, nn.Linear(4, 2))
    table = trace_shapes(net, torch.zeros(3, 4))
    rows = [(r.name, r.call, r.depth) for r in table]
    assert rows == [("", 0, 0), ("0", 0, 1), ("0.0", 0, 2), ("0.1", 0, 2), ("0.1", 1, 1), ("2", 0, 1)]
    net2 = nn.Sequential(nn.Linear(4, 4).double(), nn.Flatten())
    (_, lin, _) = trace_shapes(net2, torch.zeros(3, 4, dtype=torch.float64)).records
    assert lin.input_dtypes == ("float64",) and lin.output_dtypes == ("float64",)
    table = trace_shapes(nn.Sequential(nn.Linear(2, 2), _ToHalf()), torch.zeros(1, 2))
    assert table.rows()[2][5] == "float32->float16"


class _ToHalf(nn.Module):
    def forward(self, x):
        return x.half()


def test_printed_table_lines():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    text = str(trace_shapes(net, torch.zeros(1, 1, 4, 4)))
    lines = text.splitlines()
    # 1*2*3*3 + 2 = 20 parameters
    assert lines[0].split() == ["#", "layer", "type", "input", "output", "dtype", "params"]
    assert set(lines[1]) == {"-"}
    assert lines[2].split() == ["0", "(model)", "Sequential", "1x1x4x4", "1x8", "float32", "20"]
    assert lines[3].split() == ["1", "0", "Conv2d", "1x1x4x4", "1x2x2x2", "float32", "20"]
    assert lines[4].split() == ["2", "1", "Flatten", "1x2x2x2", "1x8", "float32", "0"]
    assert lines[5] == "3 calls, 20 parameters"


def test_hooks_removed_when_forward_raises():
    model = TinyNet()
    model.fail = True
    try:
        trace_shapes(model, tiny_input())
    except RuntimeError as err:
        assert "boom" in str(err)
    else:  # pragma: no cover
        raise AssertionError("expected the forward to raise")
    assert hook_count(model) == 0


def test_cli_layers_with_factory_and_inspect():
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["layers", "--model", "models:ResBlockNet", "--input-shape", "1,3,8,8", "--inspect"])
    text = out.getvalue()
    assert code == 0
    assert "conv0" in text and "bn2" in text and "1x8x8x8" in text
    assert "[functional]" in text and "[inplace]" in text
    table_rows = [line for line in text.splitlines() if line.strip()[:1].isdigit() and "x" in line]
    assert len(table_rows) == len(trace_shapes(ResBlockNet(), torch.zeros(1, 3, 8, 8)))


def test_cli_layers_torchvision_depth_and_bad_model(capsys):
    assert main(["layers", "--model", "torchvision:resnet18", "--input-shape", "1,3,32,32", "--depth", "1"]) == 0
    text = capsys.readouterr().out
    names = [line.split()[1] for line in text.splitlines()[2:-1]]
    assert names == ["(model)", "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc"]
    assert main(["layers", "--model", "resnet18"]) == 2
    assert "torchvision:NAME" in capsys.readouterr().err
    assert main(["layers", "--model", "torchvision:no_such_net"]) == 2
