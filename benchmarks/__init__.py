"""camkit's benchmark suite: ``python -m benchmarks`` (or ``make bench``).

Cases live in ``benchmarks/case_*.py`` and are discovered by the runner
(:mod:`benchmarks._runner`); the measuring tools are in :mod:`benchmarks._harness`.
See ``benchmarks/README.md``.
"""
