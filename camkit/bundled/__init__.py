"""What camkit ships to show and test itself: the shapes data set and the models trained on it.

* :mod:`camkit.bundled.shapes`: the seeded generator of the shapes data set (images, boxes, CSV
  manifest), whose circles mostly carry a corner watermark: a shortcut for the audit to find.
* :mod:`camkit.bundled.model`: the small CNN and the loader of its bundled, trained weights
  (``camkit/assets/shapes_cnn.pt``).
* :mod:`camkit.bundled.vit`: the tiny vision transformer trained on the same data.

The demo (:mod:`camkit.demo`), model loading (``--model demo``), the docs and the tests use them;
the weights were made by ``python -m camkit.demo.train``. This wing imports only ``errors`` and ``io``.
"""
