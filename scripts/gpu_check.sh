#!/usr/bin/env bash
# One prepared check for a lent GPU machine (issue 42, item 4): install, the GPU test subset, the
# headline benchmarks; one JSON at the end. Run from anywhere: bash scripts/gpu_check.sh
#
#   1. install   a venv (.venv, made if missing) with `pip install torch==2.13.0 -e '.[dev,gpu]'`
#                (PyPI is all the machine reaches; torch's PyPI wheel for Linux is the CUDA one)
#   2. tests     every structured mixer x mode on CUDA float32 against the CPU float64 result, and
#                the backends against each other on CUDA (tests/mixers/test_structured_gpu.py,
#                marker gpu), and the Triton kernels against the torch path on CUDA tensors
#                (tests/ops/test_triton_solve.py, tests/ops/test_triton_decode.py with
#                TRITON_INTERPRET=0: their GPU mode)
#   3. targets   python -m tokenmix.bench.gpu_targets: pow2_ce fwd+bwd at B=8, H=16, T=8192, D=64
#                against SDPA (flash, bf16) and fla's chunk_gla; the decode step at a 16k context
#                against fla's fused recurrent GLA step (docs/results.md, "GPU targets")
#
# Each step runs under its own timeout (install 300 s, tests 150 s, targets 180 s: under 8 minutes
# in all) and a failed step does not stop the next. Everything goes under $OUT (or ./gpu_check/):
# one log per step and gpu_check.json = {steps: [{step, rc, seconds}], tests: {passed, failed,
# skipped, errors, failures: [...]}, targets: <gpu_targets.json>, nvidia_smi}.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST="${OUT:-./gpu_check}"
mkdir -p "$DEST"
: > "$DEST/steps.jsonl"
export TRITON_INTERPRET=0 OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run it under a timeout, log to $DEST/NAME.log, record rc and time
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name (timeout ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$DEST/$name.log" 2>&1
    rc=$?
    echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(($(date +%s) - start))}" >>"$DEST/steps.jsonl"
    tail -n 3 "$DEST/$name.log"
    return 0
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$DEST/nvidia_smi.txt" 2>&1
[ -x .venv/bin/python ] || python3 -m venv .venv
if [ -z "${GPU_CHECK_SKIP_INSTALL:-}" ]; then  # (set: a venv already installed, e.g. a dry run without a GPU)
    step install 300 .venv/bin/pip install --quiet torch==2.13.0 -e '.[dev,gpu]'
fi
step tests 150 .venv/bin/python -m pytest -q -p no:cacheprovider -o addopts="" \
    --junitxml="$DEST/tests.xml" \
    tests/mixers/test_structured_gpu.py tests/ops/test_triton_solve.py tests/ops/test_triton_decode.py
step targets 180 .venv/bin/python -m tokenmix.bench.gpu_targets --device cuda --out "$DEST/gpu_targets.json"

.venv/bin/python - "$DEST" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

dest = Path(sys.argv[1])
out = {"steps": [json.loads(line) for line in (dest / "steps.jsonl").read_text().splitlines() if line]}
out["nvidia_smi"] = (dest / "nvidia_smi.txt").read_text().strip()
tests = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": []}
if (dest / "tests.xml").exists():
    for case in ET.parse(dest / "tests.xml").getroot().iter("testcase"):
        kinds = [child.tag for child in case]
        kind = "failed" if "failure" in kinds else "errors" if "error" in kinds else "skipped" if "skipped" in kinds else "passed"
        tests[kind] += 1
        if kind in ("failed", "errors"):
            detail = next(child for child in case if child.tag in ("failure", "error"))
            tests["failures"].append(f"{case.get('classname')}::{case.get('name')}: {(detail.get('message') or '')[:300]}")
out["tests"] = tests
targets = dest / "gpu_targets.json"
out["targets"] = json.loads(targets.read_text()) if targets.exists() else None
(dest / "gpu_check.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps({"steps": out["steps"], "tests": {k: v for k, v in tests.items() if k != "failures"},
                  "ratios": (out["targets"] or {}).get("ratios")}, indent=1))
EOF
