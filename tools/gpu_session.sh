#!/usr/bin/env bash
# Everything camkit checks on a GPU, in one call of a GPU machine (see docs/guide/gpu.md).
#
#   bash tools/gpu_session.sh                # all stages
#   STAGES="bench" bash tools/gpu_session.sh # some stages: env test-gpu suite audit-bench bench
#
# Run from the repository root. Results go to $OUT (default ./gpu-session), at most two
# folders down: env.txt, test-gpu.log, suite.log, audit-bench.log, audit-bench/RESULTS.md, bench.log,
# bench/RESULTS.md, bench/results.png.
#
# Packages the machine lacks (the anchors grad-cam, captum, torchcam, and grad-cam's ttach)
# travel as wheels in .whl/ (downloaded beforehand on a machine with pip access, see
# docs/guide/gpu.md); they are unpacked into /tmp/site and put on PYTHONPATH. The repository
# root goes on PYTHONPATH too, so camkit and the benchmarks import without installing, also
# in the subprocesses the benchmarks start.
#
# Each stage has its own time limit (seconds; the machine allows 600 per command):
# TEST_GPU_S (60), SUITE_S (150), AUDIT_BENCH_S (150), BENCH_S (210). The audit-bench stage runs
# the audit's cases on CUDA with 3 repeats: the whole process of a 64-image audit beside a bare
# script (case audit_start) and the strategies' share of an 8,192-image audit's explain time
# (case strategies); it comes before the bench stage, whose cases may not all fit in its limit.
# A stage that fails or runs out does not stop
# the next one; the exit status is that of the first failing stage. BENCH_ARGS adds arguments to
# the benchmark runner (for instance `--cases gradcam,gpu,vit` to fit the cases that matter on a
# GPU into one call).
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-$PWD/gpu-session}
STAGES=${STAGES:-"env test-gpu suite audit-bench bench"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || echo "gpu_session: installing .whl/ failed; the anchors' cases will be skipped" >&2
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

status=0
stage() {  # stage NAME LIMIT COMMAND...
    local name=$1 limit=$2
    shift 2
    case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

case " $STAGES " in *" env "*)
    {
        date -u
        git rev-parse HEAD 2>/dev/null || true
        nvidia-smi 2>&1 || true
        "$PY" - <<'PYEOF'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
for dist in ("torchvision", "timm", "transformers", "grad-cam", "captum", "torchcam", "numpy"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "not installed")
PYEOF
    } >"$OUT/env.txt" 2>&1
    cat "$OUT/env.txt";;
esac

XDIST=()
if "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n 8); fi
stage test-gpu "${TEST_GPU_S:-60}" make test-gpu PY="$PY"
stage suite "${SUITE_S:-150}" "$PY" -m pytest -q "${XDIST[@]}"
stage audit-bench "${AUDIT_BENCH_S:-150}" "$PY" -m benchmarks --device cuda --cases audit_start,strategies --repeats 3 \
    --out "$OUT/audit-bench"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
stage bench "${BENCH_S:-210}" "$PY" -m benchmarks --device cuda --out "$OUT/bench" ${BENCH_ARGS:-}
exit $status
