#!/usr/bin/env bash
# Everything camkit checks on a GPU, in one call of a GPU machine (see docs/guide/gpu.md).
#
#   bash tools/gpu_session.sh                # all stages
#   STAGES="bench" bash tools/gpu_session.sh # some stages: env test-gpu bench-attention bench audit-bench metrics vlm suite
#
# Run from the repository root. Results go to $OUT (default ./gpu-session), at most two
# folders down: env.txt, test-gpu.log, <stage>.log and <stage>/RESULTS.md for each benchmark stage
# (bench-attention, bench, audit-bench, metrics), bench/results.png.
#
# Packages the machine lacks (the anchors grad-cam, captum, torchcam, and grad-cam's ttach)
# travel as wheels in .whl/ (downloaded beforehand on a machine with pip access, see
# docs/guide/gpu.md); they are unpacked into /tmp/site and put on PYTHONPATH. The repository
# root goes on PYTHONPATH too, so camkit and the benchmarks import without installing, also
# in the subprocesses the benchmarks start.
#
# Each stage has its own time limit (seconds; the machine allows 600 per command):
# TEST_GPU_S (60), BENCH_ATTN_S (120), BENCH_S (180), AUDIT_BENCH_S (120), METRICS_S (90): 570 s in all,
# so that the default stages fit in one 10-minute command. `suite` (SUITE_S, 150: the whole test suite on
# the GPU machine) and `vlm` (VLM_S, 300) are not among the default stages; name them in STAGES to run them.
# - vlm: the vision-language case (case vlm): an answer of 16 tokens of a LLaVA 1.5 built from code (a ViT-B/14
#   tower at 336 x 336 and a 1.1B Llama in bfloat16; VLM_ARGS="--full" adds LLaVA 1.5 7B's shape) explained by
#   every registered method against generating it, time and peak memory, camkit's occlusion beside captum 0.9's
#   LLMAttribution(FeatureAblation) (captum's wheel in .whl/ for the comparison).
# - bench-attention: the attention methods' cases alone (case vit: CheferRollout and LeGrad on both paths
#   beside torchcam's LeGrad, vit_b_16 and vit_l_16 at batch 8 and 32, memory by CUDA's counter in the
#   same process; case attnlrp: AttnLRP beside LXT and a no-grad forward).
# - bench: the GPU cases of Grad-CAM (case gpu: the five gradient CAMs at batch 1, 8 and 64 on resnet50,
#   convnext_tiny and vit_b_16, Grad-CAM also compiled beside a graph-replayed forward; it starts no new
#   configuration after 150 s, OVERHEAD_BUDGET_S in benchmarks/case_gpu.py, and the rows left out say
#   so) and the detectors (case detection: Faster R-CNN at batch 2 and 8, YOLOv8n at batch 8 and
#   RetinaNet at batch 4, with the floor of the backward the score needs). BENCH_CASES replaces the list.
# - audit-bench: the whole process of a 64-image audit beside a bare script (case audit_start) and the
#   strategies' share of an 8,192-image audit's explain time (case strategies).
# - metrics: camkit.metrics and every camkit.compat.quantus class beside Quantus and their floors
#   (quantus's wheel in .whl/ for the comparison).
# test-gpu runs every `cuda`-marked test (the compiled path's CUDA graphs among them: tiny models, a few
# seconds). A stage that fails or runs out does not stop the next one; the exit status is that of the
# first failing stage. BENCH_ARGS adds arguments to the bench stage's runner.
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-$PWD/gpu-session}
STAGES=${STAGES:-"env test-gpu bench-attention bench audit-bench metrics"}
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
stage audit-bench "${AUDIT_BENCH_S:-120}" "$PY" -m benchmarks --device cuda --cases audit_start,strategies --repeats 3 \
    --out "$OUT/audit-bench"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
stage bench-attention "${BENCH_ATTN_S:-120}" "$PY" -m benchmarks --device cuda --cases vit,attnlrp \
    --out "$OUT/bench-attention"
stage bench "${BENCH_S:-180}" "$PY" -m benchmarks --device cuda --cases "${BENCH_CASES:-gpu,detection}" \
    --out "$OUT/bench" ${BENCH_ARGS:-}
stage metrics "${METRICS_S:-90}" "$PY" -m benchmarks --device cuda --cases metrics,quantus_compat --repeats 3 \
    --out "$OUT/metrics"
# shellcheck disable=SC2086  # VLM_ARGS is a list of arguments
stage vlm "${VLM_S:-300}" "$PY" -m benchmarks --device cuda --cases vlm --out "$OUT/vlm" ${VLM_ARGS:-}
stage suite "${SUITE_S:-150}" "$PY" -m pytest -q "${XDIST[@]}"
exit $status
