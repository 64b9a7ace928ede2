#!/usr/bin/env bash
# One prepared check for a lent GPU machine (issue 42, item 4): the GPU test subset and the headline
# benchmarks, one JSON at the end. Run from the repository root: bash scripts/gpu_check.sh
#
# The lent machines reach no package index: the check runs on the image's own python3 (its CUDA torch,
# triton, numba, pytest, ... : ../.library/device/KINDS.md) with this checkout on PYTHONPATH, nothing
# installed. fla (for the chunk_gla comparison) is not in the image: carry its wheel in .whl/
# (`pip download --no-deps -d .whl fla-core==0.6.0` here, `carry: [".whl"]`) and it is put on the path.
#   0. cuda      python3 sees a GPU and triton imports (else the JSON says so and the script stops)
#   1. tests     every structured mixer x mode on CUDA float32 against the CPU float64 result, and
#                the backends against each other on CUDA (tests/mixers/test_structured_gpu.py,
#                marker gpu), and the Triton kernels against the torch path on CUDA tensors
#                (tests/ops/test_triton_solve.py, tests/ops/test_triton_decode.py, compiled: their
#                GPU mode)
#   2. targets   python3 -m tokenmix.bench.gpu_targets: pow2_ce fwd+bwd at B=8, H=16, T=8192, D=64
#                against SDPA (flash, bf16) and fla's chunk_gla; the decode step at a 16k context
#                against fla's fused recurrent GLA step (docs/results.md, "GPU targets")
#
# Each step runs under its own timeout (tests 200 s, targets 200 s: under 8 minutes with the start)
# and a failed step does not stop the next; the summary is written on exit, whatever stopped the
# script. Everything goes under $OUT (or ./gpu_check/): one log per step and gpu_check.json =
# {steps: [{step, rc, seconds}], tests: {passed, failed, skipped, errors, failures: [...]},
# targets: <gpu_targets.json>, nvidia_smi, versions}.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST="${OUT:-./gpu_check}"
mkdir -p "$DEST"
: > "$DEST/steps.jsonl"
export TRITON_INTERPRET=0 OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
PY="${GPU_CHECK_PYTHON:-python3}"  # the image's python3 holds CUDA torch and triton
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then  # carried wheels (fla-core): unpacked, not installed
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

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

summary() {  # gpu_check.json from what the steps left, on exit (also after a failed or stopped step)
    "$PY" - "$DEST" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

dest = Path(sys.argv[1])
out = {"steps": [json.loads(line) for line in (dest / "steps.jsonl").read_text().splitlines() if line]}
out["nvidia_smi"] = (dest / "nvidia_smi.txt").read_text().strip()
out["versions"] = (dest / "cuda.log").read_text().strip()[-300:] if (dest / "cuda.log").exists() else None
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
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$DEST/nvidia_smi.txt" 2>&1
trap summary EXIT
step cuda 60 "$PY" -c 'import torch, triton; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())' || true
if ! grep -q '"step": "cuda", "rc": 0' "$DEST/steps.jsonl"; then
    exit 1
fi
step tests 200 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
    --junitxml="$DEST/tests.xml" \
    tests/mixers/test_structured_gpu.py tests/ops/test_triton_solve.py tests/ops/test_triton_decode.py
step targets 200 "$PY" -m tokenmix.bench.gpu_targets --device cuda --out "$DEST/gpu_targets.json"

