"""``camkit explain``: explain a few files and write overlays, maps and a manifest.

``files`` (:func:`explain_files`: images, and the dispatch to the others), ``media`` (volumes,
videos and signals) and ``detect`` (detectors and segmenters: one overlay per detection or class).
"""

from .files import explain_files

__all__ = ["explain_files"]
