"""``python -m benchmarks``: run the benchmark cases and regenerate ``RESULTS.md``."""

import os

# numpy's OpenBLAS (scikit-learn inside pytorch-grad-cam's KPCA_CAM, say) starts a thread per core that
# keeps spinning after each call, competing with torch's threads for this machine's cores and making the
# calls that follow slow at random. camkit does no numpy linear algebra; torch's own threads are not
# affected. Set before torch and numpy are imported; an explicit setting wins. RESULTS.md names it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ._runner import main

raise SystemExit(main())
