"""``camkit explain``: explain a few files and write overlays, maps and a manifest.

``files`` (:func:`explain_files`: images, and the dispatch to the others), ``media`` (volumes,
videos and signals), ``detect`` (detectors and segmenters: one overlay per detection or class),
``generation`` (vision-language models with ``--prompt``: a strip, a page and the tokens of each
answer) and ``tokens_page`` (that page: pointing at a word shows its map).
"""

from .files import explain_files

__all__ = ["explain_files"]
