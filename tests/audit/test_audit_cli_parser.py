"""The command line builds the options of the subcommand it runs only: ``camkit audit`` never loads the evaluation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from camkit.cli import build_parser, chosen_command

LINE = ["audit", "data", "--model", "demo", "--out", "out", "--batch-size", "8", "--no-strategies", "--workers", "0"]


def test_the_chosen_parser_reads_a_line_as_the_whole_parser_does():
    assert vars(build_parser("audit").parse_args(LINE)) == vars(build_parser().parse_args(LINE))
    assert chosen_command(LINE) == "audit" and chosen_command(["--version"]) is None


def test_every_subcommand_stays_listed_and_unknown_options_still_fail(capsys):
    parser = build_parser("audit")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("audit", "evaluate", "explain", "demo"))
    with pytest.raises(SystemExit):
        parser.parse_args([*LINE, "--no-such-option"])


def test_camkit_audit_does_not_import_the_evaluation():
    code = (
        "import sys\n"
        "from camkit.cli import build_parser, chosen_command\n"
        f"line = {LINE!r}\n"
        "build_parser(chosen_command(line)).parse_args(line)\n"
        "print(sorted(m for m in ('camkit.evaluation', 'scipy', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
