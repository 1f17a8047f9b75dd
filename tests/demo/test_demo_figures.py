"""The demo figures quoted in README.md and docs/demo.md are what a fresh ``camkit demo`` run measures.

Figures in the text carry a tag right after them, ``99.1%<!-- demo:marked -->`` (invisible once
rendered); the tag names a key of the run's ``figures.json``, and the text must equal the value
formatted at the precision the text uses. Every percentage in docs/demo.md and in the README's
demo section must be tagged (or listed in ``NOT_FROM_THE_DEMO`` with the reason), and the
printed lines quoted in code blocks must be the lines the run printed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from camkit.cli import main
from camkit.demo.run import _accuracy_lines

ROOT = Path(__file__).resolve().parents[2]
TAGGED = re.compile(r"(?P<number>\d+(?:\.\d+)?)%(?:\*\*)?<!-- demo:(?P<key>[\w.+]+) -->")
PERCENT = re.compile(r"\d+(?:\.\d+)?%")
CODE = re.compile(r"^```.*?^```", re.S | re.M)
# Percentages that are not demo measurements, with why.
NOT_FROM_THE_DEMO = {
    ("docs/demo.md", "85%"): "the pointing-game threshold of tests/bundled/test_bundled_model.py",
    ("docs/demo.md", "98%"): "the demo ViT's marked-circle accuracy, checked against shapes_vit.json in tests/bundled/test_bundled_vit.py",
    ("docs/demo.md", "23.8%"): "the demo ViT's clean accuracy, checked against shapes_vit.json in tests/bundled/test_bundled_vit.py",
}


def quoted_text() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## What the demo shows") : readme.index("## What works today")]
    return {"README.md": section, "docs/demo.md": (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")}


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--out", str(out)]) == 0  # the defaults of `make demo`
    return json.loads((out / "figures.json").read_text())


def test_the_tags_are_found_and_the_check_can_fail():
    text = quoted_text()
    assert len(TAGGED.findall(text["docs/demo.md"])) >= 25 and len(TAGGED.findall(text["README.md"])) == 3
    assert formatted(0.9912, "99.1") == "99.1" and formatted(0.9912, "99") == "99" and formatted(0.9912, "99.0") != "99.0"


def formatted(value: float, written: str) -> str:
    decimals = len(written.split(".")[1]) if "." in written else 0
    return f"{100 * value:.{decimals}f}"


@pytest.mark.heavy
def test_every_quoted_figure_matches_a_fresh_demo_run(fresh_run):
    figures = fresh_run
    assert figures["images"] == 200
    wrong, untagged = [], []
    for name, text in quoted_text().items():
        prose = CODE.sub("", text)
        for match in TAGGED.finditer(prose):
            key, number = match.group("key"), match.group("number")
            if key not in figures:
                wrong.append(f"{name}: unknown key {key!r}")
            elif formatted(figures[key], number) != number:
                wrong.append(f"{name}: {number}% for {key}, the demo measured {formatted(figures[key], number)}%")
        for match in PERCENT.finditer(TAGGED.sub("", prose)):
            if (name, match.group()) not in NOT_FROM_THE_DEMO:
                untagged.append(f"{name}: {match.group()} near {prose[max(0, match.start() - 40) : match.end()]!r}")
    assert not wrong, "\n".join(wrong)
    assert not untagged, "untagged figures (add <!-- demo:KEY -->):\n" + "\n".join(untagged)


def test_printed_lines_quoted_in_the_docs_are_the_printed_lines(fresh_run):
    printed = [fresh_run["finding"], *_accuracy_lines(fresh_run)]
    prefixes = [line.split(":")[0] for line in printed]
    quoted = 0
    for name, text in quoted_text().items():
        for block in CODE.findall(text):
            for line in block.splitlines():
                for prefix, expected in zip(prefixes, printed):
                    if line.startswith(prefix + ":"):
                        assert line == expected, f"{name} quotes {line!r}; the demo printed {expected!r}"
                        quoted += 1
    assert quoted >= 5  # the finding (README and docs/demo.md) and the three accuracy lines


def test_strategy_finding_matches_the_generator(fresh_run):
    """Without masks, the top-ranked map strategies of the demo are the circles that carry the watermark."""
    figures = fresh_run
    assert figures["strategy.names"] and all(n.startswith("circle/") for n in figures["strategy.names"])
    assert figures["strategy.purity"] >= 0.95  # every image in them carries the watermark (the manifest's 'marked')
    assert figures["strategy.recall"] >= 0.95  # and they hold the watermarked circles
    assert figures["strategy.accuracy"] >= 0.95 and figures["strategy.unmarked_accuracy"] <= 0.2
    assert figures["strategy_finding"].startswith("finding without masks: class 'circle'")
