"""``torchrun --nproc_per_node 2`` audit on the CPU (gloo) equals the one-process run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from audit_helpers import cli_env, make_images, read_rows

import camkit


@pytest.mark.heavy
def test_two_process_torchrun_equals_one_process(tmp_path):
    data = make_images(tmp_path / "data", per_class=4)  # 8 images; batches of 3 leave ranks uneven batches
    camkit.save_png(data / "cat" / "img9.png", camkit.read_rgb(data / "dog" / "img0.png"))  # 9 images: shards 5 / 4
    args = ["--model", "tinyfactory:tiny", "--layer", "conv2", "--size", "32", "--device", "cpu",
            "--workers", "0", "--batch-size", "3", "--no-progress", "--alphabetical-classes"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "camkit", "audit", str(data), *args, "--out", str(tmp_path / "dist")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("audited 9 of 9 image(s)") == 1  # rank 0 reports once

    single = camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "one", layer="conv2", size=32, device="cpu",
                          workers=0, batch_size=4, progress=False, alphabetical_classes=True)  # fmt: skip
    one, two = read_rows(tmp_path / "one" / "results.csv"), read_rows(tmp_path / "dist" / "results.csv")
    assert [r["key"] for r in two] == [r["key"] for r in one] and len(one) == 9
    for a, b in zip(one, two):
        assert (a["prediction"], a["target"], a["correct"], a["overlay"]) == (
            b["prediction"],
            b["target"],
            b["correct"],
            b["overlay"],
        )
        for col in ("confidence", "spread", "border"):
            assert float(a[col]) == pytest.approx(float(b[col]), abs=1e-5)
        assert (a["strategy"], a["concept_strategy"]) == (b["strategy"], b["concept_strategy"])
    summary = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["accuracy"] == pytest.approx(single["accuracy"])
    # every rank's strategy features (a sidecar per part) are read once by rank 0 at the merge
    assert summary["strategies"]["images"] == 9 and summary["strategies"]["left_out"] == 0
    assert {p.name.split("-")[-2] for p in (tmp_path / "dist" / "parts").glob("*.npz")} == {"r000", "r001"}
    # each rank wrote its own parts, and the shards are disjoint and cover every image
    shards = {}
    for rank in ("r000", "r001"):
        keys = [json.loads(line)["key"] for part in (tmp_path / "dist" / "parts").glob(f"*-{rank}-*.jsonl")
                for line in part.read_text().splitlines()]  # fmt: skip
        shards[rank] = keys
    assert len(shards["r000"]) == 5 and len(shards["r001"]) == 4
    assert sorted(shards["r000"] + shards["r001"]) == sorted(r["key"] for r in one)
