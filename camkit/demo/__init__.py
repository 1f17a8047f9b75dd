"""The demo: an audit of the bundled shapes CNN that finds its watermark shortcut (the ``camkit demo``
command is :mod:`camkit.cli.demo`). The data set and the models are in :mod:`camkit.bundled`.

* :mod:`camkit.demo.train`: the seeded training script that produced the weights.
* :mod:`camkit.demo.run`: the audit of the bundled model and its headline (:func:`run_demo`).
"""

from .run import run_demo

__all__ = ["run_demo"]
