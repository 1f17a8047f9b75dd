"""``camkit demo`` end to end into a temporary folder (a small run: 40 images)."""

from __future__ import annotations

import csv
import json
import re

import pytest

from camkit.cli import main
from camkit.demo.run import headline


def test_headline_picks_the_class_with_most_watermark_energy() -> None:
    summary = {
        "per_class": {
            "circle": {"energy": {"watermark": 0.05}},
            "cross": {"energy": {"watermark": 0.40}},
            "square": {"energy": {"watermark": None}},
        }
    }
    name, share, others, message = headline(summary)
    assert (name, share, others) == ("cross", 0.40, 0.05)
    assert message == "class 'cross': 40% of attention energy on the watermark region (other classes: at most 5%)"
    with pytest.raises(ValueError, match="no energy for the region 'text'"):
        headline(summary, region="text")


@pytest.mark.heavy
def test_camkit_demo_writes_reports_and_prints_the_finding(tmp_path, capsys) -> None:
    assert main(["demo", "--out", str(tmp_path), "--images", "40"]) == 0
    printed = capsys.readouterr().out
    found = re.search(r"finding: class 'circle': (\d+)% of attention energy on the watermark region "
                      r"\(other classes: at most (\d+)%\)", printed)  # fmt: skip
    assert found, printed
    share, others = int(found.group(1)), int(found.group(2))
    assert share > 2 * max(others, 1)
    summary = json.loads((tmp_path / "gradcam" / "summary.json").read_text())
    assert summary["images"] == 40 and summary["errors"] == 0
    assert round(100 * summary["per_class"]["circle"]["energy"]["watermark"]) == share
    for method in ("gradcam", "gradcampp"):
        html = (tmp_path / method / "report.html").read_text()
        assert "energy watermark" in html and "data:image/png;base64," in html
        with open(tmp_path / method / "results.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == 40 and all((tmp_path / method / r["overlay"]).is_file() for r in rows)
    with open(tmp_path / "data" / "manifest.csv", newline="") as handle:
        assert sum(1 for _ in csv.DictReader(handle)) == 40
    assert "finding without masks: class '" in printed  # the third audit, without regions
    plain = json.loads((tmp_path / "strategies" / "summary.json").read_text())
    assert plain["regions"] == [] and plain["strategies"]["images"] == 40
    assert "Strategies (found without masks)" in (tmp_path / "strategies" / "report.html").read_text()
