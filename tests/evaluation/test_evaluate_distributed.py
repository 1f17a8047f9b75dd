"""``torchrun --nproc_per_node 2 camkit evaluate`` on the CPU (gloo) gives the one-process scores."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from audit_helpers import cli_env
from evaluate_helpers import write_manifest

from camkit.cli import main

ARGS = ["--model", "evaluate_helpers:truth_model", "--size", "16", "--mean", "0", "0", "0", "--std", "1", "1", "1",
        "--device", "cpu", "--layer", "relu", "--steps", "4", "--no-progress", "--batch-size", "2",
        "--methods", "saliency,hirescam", "--metrics", "deletion,energy_pointing_game"]  # fmt: skip


def scores(path):
    with open(path, newline="") as handle:
        return {(r["key"], r["method"], r["metric"]): float(r["value"]) for r in csv.DictReader(handle)}


@pytest.mark.slow
def test_two_process_torchrun_equals_one_process(tmp_path):
    data = write_manifest(tmp_path / "data", 7)  # shards of 4 and 3 images
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "camkit", "evaluate", str(data), *ARGS, "--out", str(tmp_path / "dist")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("evaluated 7 of 7 image(s)") == 1  # rank 0 reports once
    assert main(["evaluate", str(data), *ARGS, "--out", str(tmp_path / "one")]) == 0
    one, two = scores(tmp_path / "one" / "scores.csv"), scores(tmp_path / "dist" / "scores.csv")
    assert one.keys() == two.keys() and len(one) == 7 * 5 * 2
    assert max(abs(one[k] - two[k]) for k in one) < 1e-5
    summary = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert summary["world_size"] == 2
    ranks = {p.name.split("-r")[1][:3] for p in (tmp_path / "dist" / "parts").glob("*.jsonl")}
    assert ranks == {"000", "001"}
