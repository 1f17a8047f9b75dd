"""The bundled demo: a shapes dataset with a watermark shortcut, a small CNN trained on it,
and the demo run that audits it (the ``camkit demo`` command is :mod:`camkit.cli.demo`).

* :mod:`camkit.demo.shapes`: the seeded dataset generator (images, boxes, CSV manifest).
* :mod:`camkit.demo.model`: the CNN and the loader of the bundled weights.
* :mod:`camkit.demo.train`: the seeded training script that produced the weights.
* :mod:`camkit.demo.run`: the audit of the bundled model and its headline (:func:`run_demo`).
"""

from .run import run_demo

__all__ = ["run_demo"]
