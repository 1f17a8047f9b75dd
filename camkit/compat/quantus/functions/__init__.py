"""Quantus's function modules that camkit's translation provides: ``quantus.functions.<name>`` after ``install()``.

Each is camkit's own implementation of Quantus's formula, with Quantus's signature and calling
convention (numpy in, numpy out; ``batched=True`` rows), so a function passed to a metric class
is called the way Quantus calls it; ``explanation_func.explain`` runs camkit's explainers and
``perturb_func`` holds Quantus's perturbation names (see there); ``mosaic_func``'s builders are
names only, raising when called. Quantus's helpers (``quantus.helpers``: model wrappers,
utilities, plotting) are not translated and raise a clear error after ``install()``.
"""

from . import (
    complexity_func,
    discretise_func,
    explanation_func,
    loss_func,
    mosaic_func,
    n_bins_func,
    norm_func,
    normalise_func,
    perturb_func,
    similarity_func,
)

__all__ = [
    "complexity_func",
    "discretise_func",
    "explanation_func",
    "loss_func",
    "mosaic_func",
    "n_bins_func",
    "norm_func",
    "normalise_func",
    "perturb_func",
    "similarity_func",
]
