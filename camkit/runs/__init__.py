"""The plumbing of a run, shared by ``camkit explain``, ``camkit audit`` and ``camkit.evaluate``.

``data`` (finding and reading the images, labels and regions), ``labels`` (label names to
output indices), ``targeting`` (which class each image is explained for), ``explaining`` (build
an explainer, explain a batch), ``media`` (the same for volumes, videos and signals), ``loaders``
(the decode stage), ``outdir`` (the output folder's rules and ``AuditError``), ``files`` (atomic
writes, safe names, encoders) and ``distributed`` (sharding over ``torchrun``). Import them by
path, e.g. ``from camkit.runs.data import discover``.
"""
