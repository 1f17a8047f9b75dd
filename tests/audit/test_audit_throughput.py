"""The audit's throughput choices keep its results: the thread limit (the CPU top-k sum: tests/metrics)."""

from __future__ import annotations

import importlib

import pytest
import torch
from audit_helpers import make_images, read_rows

import camkit
from camkit.audit.stages import ThreadPacer, explain_threads

stages = importlib.import_module("camkit.audit.stages")  # the module, not a name camkit.audit re-exports


def test_explain_threads_leave_the_workers_their_cores(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(stages, "_cores", lambda: 2)
    assert explain_threads(cpu, workers=2, current=2) == 1  # the benchmark machine: 2 cores, 2 workers
    assert explain_threads(cpu, workers=0, current=2) == 2  # decoding in this process: torch keeps its threads
    monkeypatch.setattr(stages, "_cores", lambda: 8)
    assert explain_threads(cpu, workers=3, current=8) == 5
    assert explain_threads(cpu, workers=3, current=2) == 2  # never more threads than the user set
    assert explain_threads(cuda, workers=3, current=8) == 8


def test_thread_pacer_follows_the_stage_that_waits(monkeypatch):
    monkeypatch.setattr(stages, "_cores", lambda: 2)
    cpu = torch.device("cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        with pytest.raises(RuntimeError, match="boom"), ThreadPacer(cpu, workers=2) as pacer:
            seen.append(torch.get_num_threads())  # starts on the core the 2 workers leave
            for wait in (0.001, 0.01, 0.03, 0.01, 0.004):  # against 0.1 s of work per batch
                pacer.update(wait=wait, work=0.1)
                seen.append(torch.get_num_threads())
            raise RuntimeError("boom")
        # 1% < 5%: model-bound, torch's 2; 10% between the marks: kept; 30% > 25%: back to 1; then 4% < 5%
        assert seen == [1, 2, 2, 1, 1, 2]
        assert torch.get_num_threads() == 2  # restored, also after an error
        for device, workers in ((cpu, 0), (torch.device("cuda"), 2)):  # nothing to share, or a GPU model
            with ThreadPacer(device, workers) as pacer:
                pacer.update(wait=1.0, work=0.1)
                assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_audit_runs_the_model_on_the_cores_workers_leave_then_restores(tmp_path, monkeypatch):
    data = make_images(tmp_path / "data", classes=(), per_class=3)
    monkeypatch.setattr(stages, "_cores", lambda: 2)
    seen = []
    call = stages.ExplainStage.__call__

    def spy(self, batch):
        seen.append(torch.get_num_threads())
        return call(self, batch)

    monkeypatch.setattr(stages.ExplainStage, "__call__", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        summary = camkit.audit(
            data, "tinyfactory:tiny", out=tmp_path / "out", layer="conv2", size=32, device="cpu", workers=1,
            batch_size=2, progress=False,
        )  # fmt: skip
        # 2 cores - 1 worker; the second batch keeps it (the first wait, the workers' start, is not a measure)
        assert seen == [1, 1] and torch.get_num_threads() == 2
        assert summary["images"] == 3 and len(read_rows(tmp_path / "out" / "results.csv")) == 3
    finally:
        torch.set_num_threads(before)
