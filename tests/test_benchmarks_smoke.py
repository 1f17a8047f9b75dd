"""The benchmark harness on tiny inputs: statistics, goals, interleaving, the memory probe,
map agreement with the anchors (when installed), the report and the runner end to end.

Nothing here writes into ``benchmarks/``: reports go to pytest's ``tmp_path``.
"""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _harness, _report, _runner, case_gradcam  # noqa: E402
from benchmarks._harness import (  # noqa: E402
    MET,
    NOT_MEASURED,
    NOT_MET,
    WITHIN_SPREAD,
    Context,
    Goal,
    Ratio,
    Row,
    Timing,
    finish_maps_like_camkit,
    goal_at_least,
    goal_at_most,
    max_abs_diff,
    paired_ratio,
    time_interleaved,
)


def test_harness_doctests_pass():
    result = doctest.testmod(_harness, verbose=False)
    assert result.attempted >= 5
    assert result.failed == 0


def test_timing_statistics():
    t = Timing((3.0, 1.0, 2.0, 10.0, 4.0))
    assert t.median == 3.0
    assert (t.min, t.max) == (1.0, 10.0)
    # inclusive quartiles of 1, 2, 3, 4, 10: positions 1 and 3 of 0..4
    assert t.iqr == (2.0, 4.0)
    assert Timing((0.5,)).iqr == (0.5, 0.5)


def test_paired_ratio_is_taken_repeat_by_repeat():
    r = paired_ratio(Timing((2.0, 3.0, 4.0)), Timing((1.0, 2.0, 2.0)))
    # per-repeat ratios 2.0, 1.5, 2.0 (the ratio of medians would be 3 / 2 = 1.5)
    assert (r.median, r.lo, r.hi) == (2.0, 1.5, 2.0)
    assert str(r) == "2.00x (1.50-2.00)"
    assert str(Ratio.exact(1.25)) == "1.25x"
    with pytest.raises(ValueError, match="same interleaved run"):
        paired_ratio(Timing((1.0,)), Timing((1.0, 2.0)))


@pytest.mark.parametrize(
    ("ratio", "status"),
    [(Ratio(1.0, 0.9, 1.1), MET), (Ratio(1.3, 1.2, 1.4), NOT_MET), (Ratio(1.1, 1.0, 1.2), WITHIN_SPREAD),
     (Ratio(1.15, 1.15, 1.15), MET), (None, NOT_MEASURED)],
)
def test_goal_at_most_uses_the_whole_spread(ratio, status):
    goal = goal_at_most("Grad-CAM", "within 1.15x", ratio, 1.15)
    assert goal.status == status
    if status == WITHIN_SPREAD:
        assert goal.reason == "the spread 1.00-1.20x straddles 1.15x"
    if status == MET:
        assert goal.reason == ""


@pytest.mark.parametrize(
    ("ratio", "status"),
    [(Ratio(3.0, 2.6, 3.2), MET), (Ratio(2.0, 1.8, 2.2), NOT_MET), (Ratio(2.6, 2.4, 2.8), WITHIN_SPREAD)],
)
def test_goal_at_least_uses_the_whole_spread(ratio, status):
    goal = goal_at_least("Grad-CAM", "2.5x faster", ratio, 2.5, reason="why")
    assert goal.status == status
    assert goal.measured == str(ratio)
    assert goal.reason == ("" if status == MET else "why")


def test_time_interleaved_rotates_the_order_and_times_each_call_alone():
    now = [0.0]
    calls: list[str] = []

    def make(name: str, cost: float):
        def fn():
            calls.append(name)
            now[0] += cost

        return fn

    timings = time_interleaved(
        {"a": make("a", 1.0), "b": make("b", 2.0), "c": make("c", 4.0)}, repeats=3, warmup=1, clock=lambda: now[0]
    )
    assert calls == list("abc" + "abc" + "bca" + "cab")
    assert timings["a"].samples == (1.0, 1.0, 1.0)
    assert timings["b"].samples == (2.0, 2.0, 2.0)
    assert timings["c"].samples == (4.0, 4.0, 4.0)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        time_interleaved({"a": make("a", 1.0)}, repeats=0, warmup=0)


def test_finish_maps_like_camkit_matches_the_output_contract():
    # 2 -> 4 bilinear, align_corners=False: source x = (i + 0.5) / 2 - 0.5 = -0.25 (clamped), 0.25, 0.75, 1.25
    # (clamped) -> 0, 0.5, 1.5, 2 -> min-max -> 0, 0.25, 0.75, 1
    out = finish_maps_like_camkit(torch.tensor([[[0.0, 2.0]]]), (1, 4))
    torch.testing.assert_close(out, torch.tensor([[[0.0, 0.25, 0.75, 1.0]]]))
    # [B, 1, h, w] is accepted; an affine change of the raw map (an anchor's own normalisation) changes nothing
    raw = torch.rand(2, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(finish_maps_like_camkit(raw, (9, 9)), finish_maps_like_camkit(3 * raw[:, 0] + 5, (9, 9)))
    # constant maps become zeros, never NaN
    assert torch.equal(finish_maps_like_camkit(torch.ones(1, 2, 2), (4, 4)), torch.zeros(1, 4, 4))


def test_max_abs_diff_accepts_arrays_and_checks_shapes():
    assert max_abs_diff(np.array([[0.0, 0.5]], dtype=np.float32), torch.tensor([[0.25, 0.5]])) == 0.25
    with pytest.raises(ValueError, match=r"\[1, 2\] and \[2\]"):
        max_abs_diff(torch.zeros(1, 2), torch.zeros(2))


@pytest.mark.heavy
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_memory_probe_measures_a_known_allocation_in_a_fresh_process():
    ctx = Context(log=lambda msg: None)
    peak = ctx.peak_memory("benchmarks._probe:selftest_job", mib=48)
    # 48 MiB filled with ones; the interpreter's own bookkeeping adds at most a few MiB
    assert 48 <= peak < 56


@pytest.mark.heavy
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_smoke_probes_side_by_side_measure_each_process_and_name_failures():
    lines: list[str] = []
    ctx = Context(mode="smoke", threads=2, log=lines.append)
    peaks, notes = ctx.peaks("benchmarks._probe:selftest_job", {"a": {"mib": 48}, "b": {"mib": 16}})
    # two probes at once, one thread each: every figure is its own process's
    assert set(peaks) == {"a", "b"} and 48 <= peaks["a"] < 56 and 16 <= peaks["b"] < 24 and notes == {}
    peaks, notes = ctx.peaks("benchmarks._no_such_module:job", {"gone": {}})
    assert peaks == {} and "memory probe for benchmarks._no_such_module:job {} failed (exit 1)" in notes["gone"]
    assert any(line.startswith("    memory gone: failed (") for line in lines)


def test_memory_probe_failure_is_reported_with_the_error():
    ctx = Context(log=lambda msg: None)
    with pytest.raises(_harness.BenchmarkError, match=r"(?s)benchmarks\._no_such_module.*exit 1.*ModuleNotFoundError"):
        ctx.peak_memory("benchmarks._no_such_module:job")


class _TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1))
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@pytest.mark.parametrize(("impl", "module"), [("pytorch-grad-cam", "pytorch_grad_cam"), ("captum", "captum"),
                                              ("torchcam", "torchcam")])
def test_anchor_maps_agree_with_camkit_on_a_tiny_model(impl, module):
    pytest.importorskip(module)
    model = _TinyCNN().eval()
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    classes = case_gradcam.top1(model, x)
    ours = case_gradcam.prepare("camkit", model, "features.2", x, classes)
    theirs = case_gradcam.prepare(impl, model, "features.2", x, classes)
    try:
        ours_maps = ours.run()
        assert theirs.maps is not None
        theirs_maps = theirs.maps(theirs.run())
    finally:
        theirs.close()
    assert theirs_maps.shape == ours_maps.shape == (3, 16, 16)
    assert max_abs_diff(ours_maps, theirs_maps) < 1e-5
    # the anchor worked on its own copy: the caller's model carries no hooks
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())


def _rows() -> list[Row | Goal]:
    fwd = Timing((0.100, 0.090, 0.110))
    ours = Timing((0.110, 0.100, 0.120))
    rows = _harness.rows_for_timings(
        "Grad-CAM", {"no-grad forward": fwd, "camkit": ours}, reference="no-grad forward", model="resnet50",
        batch=8, device=torch.device("cpu"),
    )
    rows += _harness.memory_rows(
        "Grad-CAM", {"no-grad forward": 200.0, "camkit": 220.0}, reference="no-grad forward", model="resnet50",
        batch=16, device=torch.device("cpu"),
    )
    return [*rows, Row("Grad-CAM", "torchcam", "vit_b_16", 1, note="ValueError: no spatial | layer"),
            goal_at_most("Grad-CAM", "camkit within 1.15x", paired_ratio(ours, fwd), 1.15)]


@pytest.mark.parametrize("use_matplotlib", [True, False])
def test_report_writes_the_tables_goals_and_chart(tmp_path, monkeypatch, use_matplotlib):
    if use_matplotlib:
        pytest.importorskip("matplotlib")
    else:
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails: the OpenCV drawing is used
    items = _rows()
    rows = [r for r in items if isinstance(r, Row)]
    goals = [g for g in items if isinstance(g, Goal)]
    machine = _report.describe_machine([torch.device("cpu")])
    # the end load less the run's own 2 threads is 1.5 > 0.5 * 2 cores
    machine.cores, machine.threads, machine.load_start, machine.load_end = 2, 2, (0.5, 0.5, 0.5), (3.5, 1.0, 1.0)
    chart = _report.write_chart(tmp_path / "chart.png", rows)
    assert chart == tmp_path / "chart.png"
    import cv2

    image = cv2.imread(str(chart))
    assert image is not None and image.shape[0] > 50 and image.shape[1] > 300
    md = tmp_path / "RESULTS.md"
    _report.write_markdown(md, mode="smoke", machine=machine, rows=rows, goals=goals, failures=["Broken: boom"],
                           chart=chart, elapsed=12.0, command="python -m benchmarks --smoke")
    text = md.read_text()
    # per-repeat ratios 1.1/1.0, 1.0/0.9, 1.2/1.1 -> median 1.10, min 1.09, max 1.11
    assert "| camkit | resnet50 | 8 | cpu | 110.0 | 100.0-120.0 | 1.10x (1.09-1.11) vs no-grad forward |" in text
    assert "| camkit | resnet50 | 16 | cpu | 220.0 | 1.10x vs no-grad forward |" in text
    assert "| Grad-CAM | camkit within 1.15x | 1.10x (1.09-1.11) | **met** |  |" in text
    assert "- torchcam (vit_b_16, batch 1, cpu): ValueError: no spatial / layer" in text
    assert "## Failures" in text and "- Broken: boom" in text
    assert f"CPU: {_report.cpu_model()}" in text
    assert f"torch {torch.__version__}" in text
    assert "![Time per method](chart.png)" in text
    assert "Load average (1 min) at the start: 0.50; at the end: 3.50" in text
    assert "> **Preliminary**: other work was running" in text
    machine.load_end = (0.9, 0.9, 0.9)  # 0.9 <= 1.0: quiet
    _report.write_markdown(md, mode="smoke", machine=machine, rows=rows, goals=goals, failures=[], chart=None,
                           elapsed=1.0, command="x")
    assert "Preliminary" not in md.read_text() and "## Failures" not in md.read_text()


def test_runner_smoke_end_to_end_writes_only_to_the_given_directory(tmp_path, monkeypatch):
    repo_results = ROOT / "benchmarks" / "RESULTS.md"
    before = repo_results.read_bytes() if repo_results.exists() else None
    peaks = {"no-grad forward": 10.0, "camkit": 11.0}
    # The probe itself is tested above; here a fixed peak per implementation keeps the test fast.
    monkeypatch.setattr(Context, "peak_memory", lambda self, job, **p: peaks[p["impl"]])
    code = _runner.main(["--smoke", "--no-anchors", "--cases", "gradcam", "--device", "cpu", "--out", str(tmp_path)])
    assert code == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "mode: **smoke**" in text
    assert "- CPU memory allocator: " in text
    assert "### Grad-CAM" in text
    assert "| camkit | resnet18 | 4 | cpu | 11.0 | 1.10x vs no-grad forward |" in text
    assert "peak memory above the model (resnet18, 64x64, batch 4) | 1.10x | **met** |" in text
    assert "pytorch-grad-cam 1.5.7 (resnet18, 64x64, batch 2; ratio = pytorch-grad-cam time / camkit time) | - | " \
           "**not measured** |" in text
    assert (tmp_path / "results.png").stat().st_size > 0
    after = repo_results.read_bytes() if repo_results.exists() else None
    assert after == before


def test_runner_rejects_an_unknown_case():
    with pytest.raises(SystemExit, match="unknown case"):
        _runner.main(["--smoke", "--cases", "nope", "--list"])


def test_busy_takes_the_runs_own_threads_off_the_end_load():
    from benchmarks._report import Machine, busy

    def machine(start: float, end: float) -> Machine:
        return Machine(cpu="x", cores=2, threads=2, devices=["cpu"], python="3", versions={}, date="d",
                       load_start=(start, 0.0, 0.0), load_end=(end, 0.0, 0.0))  # fmt: skip

    assert not busy(machine(0.4, 1.99))  # the run's own two threads, nothing else
    assert busy(machine(0.4, 3.5))  # 1.5 more than the run's own threads
    assert busy(machine(1.2, 2.0))  # busy before the run started


def test_allocator_names_what_changes_cpu_timings(monkeypatch):
    for name in [k for k in os.environ if k.startswith("MALLOC_") or k in ("LD_PRELOAD", "GLIBC_TUNABLES")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert _report.allocator() == "the C library's malloc with its default settings"
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4294967296")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "33554432")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert _report.allocator() == (
        "preloaded libjemalloc.so.2; malloc settings MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296"
    )
    machine = _report.describe_machine([torch.device("cpu")])
    assert machine.allocator == _report.allocator()


def test_blas_threads_names_numpys_setting(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert _report.blas_threads() == "OpenBLAS's default (one thread per core)"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert _report.blas_threads() == "OPENBLAS_NUM_THREADS=1"
    assert _report.describe_machine([torch.device("cpu")]).blas_threads == "OPENBLAS_NUM_THREADS=1"


@pytest.mark.heavy
def test_python_m_benchmarks_runs_numpys_blas_on_one_thread():
    pytest.importorskip("threadpoolctl")
    script = (
        "import runpy, sys\n"
        "sys.argv = ['benchmarks', '--list']\n"
        "try:\n"
        "    runpy.run_module('benchmarks', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "import threadpoolctl\n"
        "print('BLAS', sorted({i['num_threads'] for i in threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    last = out.stdout.strip().splitlines()[-1]
    if last == "BLAS []":
        pytest.skip("numpy does not use OpenBLAS here")
    assert last == "BLAS [1]"
