# Every target creates the virtual environment when it is missing or stale.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.camkit-installed

.PHONY: venv test test-heavy test-slow peer-suites demo lint typecheck bench bench-smoke docs clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,test]"
# lxt 2.1, AttnLRP's reference: --no-deps, its requirements name packages its ViT code never imports
	$(PY) -m pip install -q --no-deps lxt==2.1
	touch $(STAMP)

venv: $(STAMP)

# The suite runs on every core (pytest-xdist); `$(PY) -m pytest tests/x.py` runs one file in one process.
test: $(STAMP)
	$(PY) -m pytest -q -n auto

# The slowest cases (marker `slow`), run by hand: CI leaves them out to stay within its 30 minutes.
test-slow: $(STAMP)
	$(PY) -m pytest -q -n auto -m slow

# The cases of tens of seconds that `make test` leaves out to stay under 5 minutes (marker `heavy`); CI runs them.
test-heavy: $(STAMP)
	$(PY) -m pytest -q -n auto -m "heavy and not slow"

# pytorch-grad-cam's, torchcam's, captum's and Quantus's own test files (../shared/peer-suites, beside the checkout) run
# against the originals at the versions those files belong to and against camkit's compat layers
# (tools/peer_suites.py); skipped with a message where ../shared/peer-suites is absent.
# PEER_ARGS passes options: `make peer-suites PEER_ARGS="--suite torchcam"`; `--ci --jobs 2` is the default (two runs at a time, one torch thread each on 2 CPUs).
PEER_ARGS ?= --ci --jobs 2
peer-suites: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt grad-cam==1.5.7 torchcam==0.5.0
# Quantus's tests need pytest 7 (pytest-lazy-fixture breaks on 8+): their own folder, first on PYTHONPATH for those runs only
	test -f $(VENV)/peer-quantus/pytest_lazyfixture.py || $(PY) -m pip install -q --target $(VENV)/peer-quantus \
		pytest==7.4.4 pytest-lazy-fixture==0.6.3 pytest-mock==3.10.0
	$(PY) tools/peer_suites.py $(PEER_ARGS)

demo: $(STAMP)
	$(PY) -m camkit demo

lint: $(STAMP)
	$(PY) -m ruff check camkit tests benchmarks examples tools docs/gallery.py
	$(PY) -m mypy

docs: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[docs]"
	$(PY) -m mkdocs build --strict -d site

bench: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) -m benchmarks

bench-smoke: $(STAMP)
	$(PY) -m benchmarks --smoke --out $(VENV)/bench-smoke

# The CUDA tests (marker `cuda`: the cuda params of the device fixture and every test named *cuda*)
# with an interpreter that already has torch: `make test-gpu PY=python3` creates no venv.
.PHONY: test-gpu
test-gpu:
	$(PY) -m pytest -q -m cuda -rs

clean:
	rm -rf $(VENV) camkit-demo
