"""Case 5: overhead of ActivationMonitor and GradientMonitor on a training step.

One training step here is ``model(x).logsumexp(1).mean()``, ``backward()`` and
``zero_grad`` on a torchvision resnet50 (random weights, training mode) at batch 8, 224x224.
Timed side by side (interleaved, median of the repeats) against the same step without
monitors:

* each monitor on the 16 bottleneck blocks, sampling every step (the issue's goal: below
  1.15x of the bare step);
* each monitor on every leaf module, sampling every step (the worst case) and with the
  default ``every=10`` (what sampling every k steps costs on average).

The monitors are entered and left inside each timed call, so hook registration and removal
are included (a pessimistic bias of well under a millisecond). Smoke mode: resnet18 at 64x64,
batch 2, on its 8 basic blocks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from camkit.debug import ActivationMonitor, GradientMonitor

from ._harness import Context, Goal, Row, build_model, goal_at_most, paired_ratio, random_input, rows_for_timings

TITLE = "Activation and gradient monitors"
ORDER = 5

BARE = "forward+backward"
GOAL = 1.15


def _blocks(model: nn.Module) -> list[str]:
    from torchvision.models.resnet import BasicBlock, Bottleneck

    return [name for name, m in model.named_modules() if isinstance(m, (Bottleneck, BasicBlock))]


def _step(model: nn.Module, x: torch.Tensor, monitors: list[ActivationMonitor | GradientMonitor]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.ExitStack() as stack:
            for monitor in monitors:
                stack.enter_context(monitor)
            model(x).logsumexp(1).mean().backward()
            for monitor in monitors:
                monitor.step()
        model.zero_grad(set_to_none=True)

    return run


def run(ctx: Context) -> list[Row | Goal]:
    name, size, batch = ("resnet18", 64, 2) if ctx.smoke else ("resnet50", 224, 8)
    model = build_model(name, ctx.device).train()
    x = random_input(batch, size, ctx.device)
    blocks = _blocks(model)
    ctx.log(f"  {TITLE}: {name} {size}x{size}, batch {batch}, {len(blocks)} blocks")
    act_blocks = f"activations, {len(blocks)} blocks, every step"
    grad_blocks = f"gradients, {len(blocks)} blocks, every step"
    fns = {
        BARE: _step(model, x, []),
        act_blocks: _step(model, x, [ActivationMonitor(model, blocks, every=1)]),
        grad_blocks: _step(model, x, [GradientMonitor(model, blocks, every=1)]),
        "activations, every leaf, every step": _step(model, x, [ActivationMonitor(model, None, every=1)]),
        "gradients, every leaf, every step": _step(model, x, [GradientMonitor(model, None, every=1)]),
    }
    if not ctx.smoke:
        fns["both, every leaf, every=10 (default)"] = _step(
            model, x, [ActivationMonitor(model, None, every=10), GradientMonitor(model, None, every=10)]
        )
    timings = ctx.time(fns)
    rows: list[Row | Goal] = list(
        rows_for_timings(TITLE, timings, reference=BARE, model=name, batch=batch, device=ctx.device)
    )
    config = f"{name}, batch {batch}, forward+backward, {len(blocks)} blocks sampled every step"
    rows.append(
        goal_at_most(TITLE, f"ActivationMonitor below {GOAL}x ({config})", paired_ratio(timings[act_blocks], timings[BARE]), GOAL)
    )
    rows.append(
        goal_at_most(TITLE, f"GradientMonitor below {GOAL}x ({config})", paired_ratio(timings[grad_blocks], timings[BARE]), GOAL)
    )
    return rows
