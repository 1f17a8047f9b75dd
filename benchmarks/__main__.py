"""``python -m benchmarks``: run the benchmark cases and regenerate ``RESULTS.md``."""

from ._runner import main

raise SystemExit(main())
