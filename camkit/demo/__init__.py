"""The bundled demo: a shapes dataset with a watermark shortcut, a small CNN trained on it,
and the ``camkit demo`` command that audits it.

* :mod:`camkit.demo.shapes`: the seeded dataset generator (images, boxes, CSV manifest).
* :mod:`camkit.demo.model`: the CNN and the loader of the bundled weights.
* :mod:`camkit.demo.train`: the seeded training script that produced the weights.
"""

from .cli import run  # registers the ``demo`` command

__all__ = ["run"]
