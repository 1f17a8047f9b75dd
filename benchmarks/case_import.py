"""``import camkit``: the CPU time it adds to ``import torch, torchvision``.

Each repeat starts two fresh interpreters, one after the other (their order alternating between
repeats): one imports ``torch`` and ``torchvision``; the other imports them too, then ``camkit``.
Both report their own CPU time (``time.process_time``, user and system, all threads) for each
step, so the difference ``import camkit`` makes is read inside one process, with torch already
loaded, and the bare process beside it shows how steady the machine was. The goal: at most 0.3 s
of CPU time above ``import torch, torchvision``. The rows also give the number of modules
``import camkit`` loads (of the package's own and in all) and the slowest of them by
``python -X importtime`` (cumulative microseconds).

The measurement does not depend on the device; it runs once, on the CPU pass of the runner.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ._harness import MET, NOT_MET, WITHIN_SPREAD, Context, Goal, Row, Timing

TITLE = "import camkit"
ORDER = 1

GOAL_S = 0.3

_BARE = """
import json, sys, time
t0 = time.process_time(); import torch, torchvision; t1 = time.process_time()
print(json.dumps({"torch": t1 - t0}))
"""

_CAMKIT = """
import json, sys, time
t0 = time.process_time(); import torch, torchvision; t1 = time.process_time()
before = set(sys.modules)
import camkit
t2 = time.process_time()
new = [m for m in sys.modules if m not in before]
print(json.dumps({"torch": t1 - t0, "camkit": t2 - t1, "modules": len(new),
                  "own": sum(m.split(".")[0] == "camkit" for m in new)}))
"""


def _run(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, check=True)


def slowest_modules(count: int = 5) -> list[tuple[str, int]]:
    """The camkit modules with the largest cumulative time in ``python -X importtime -c "import camkit"``."""
    err = _run("import torch, torchvision\nimport camkit", "-X", "importtime").stderr
    found = []
    for line in err.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2].lstrip().startswith("camkit") and parts[1].isdigit():
            found.append((parts[2].strip(), int(parts[1])))
    return sorted(found, key=lambda item: -item[1])[:count]


def run(ctx: Context) -> list[Row | Goal]:
    if ctx.device.type != "cpu":
        return []
    bare, with_camkit, added = [], [], []
    modules = own = 0
    for r in range(ctx.repeats):
        order = (_BARE, _CAMKIT) if r % 2 == 0 else (_CAMKIT, _BARE)
        for code in order:
            result = json.loads(_run(code).stdout)
            if code is _BARE:
                bare.append(result["torch"])
            else:
                with_camkit.append(result["torch"] + result["camkit"])
                added.append(result["camkit"])
                modules, own = result["modules"], result["own"]
    slow = ", ".join(f"{name} {us / 1e3:.0f} ms" for name, us in slowest_modules())
    rows: list[Row | Goal] = [
        Row(TITLE, "import torch, torchvision (CPU time)", time=Timing(tuple(bare)), note="a fresh interpreter"),
        Row(TITLE, "import torch, torchvision, camkit (CPU time)", time=Timing(tuple(with_camkit)),
            note=f"import camkit loads {own} camkit modules, {modules} in all"),
        Row(TITLE, "import camkit after torch (CPU time)", time=Timing(tuple(added)),
            note=f"slowest (cumulative, -X importtime): {slow}"),
    ]
    median = Timing(tuple(added)).median
    status = MET if max(added) <= GOAL_S else NOT_MET if min(added) > GOAL_S else WITHIN_SPREAD
    measured = f"{median:.3f} s ({min(added):.3f}-{max(added):.3f})"
    rows.append(Goal(TITLE, f"import camkit at most {GOAL_S} s of CPU time above import torch, torchvision",
                     measured, status, {MET: "", WITHIN_SPREAD: f"the spread straddles {GOAL_S} s"}.get(
                         status, f"every repeat above {GOAL_S} s")))
    return rows
