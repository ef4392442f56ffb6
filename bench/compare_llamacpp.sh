#!/usr/bin/env bash
# Side-by-side prefill speed: lazyprefill (f32 and bf16) and llama.cpp (through the PyPI package
# llama-cpp-python) on the same model, same lengths, 2 threads, in one run. Not run by CI.
#
#   pip install llama-cpp-python numpy          # builds llama.cpp; outside this repo
#   python3 tests/fixtures/make_reference.py --make-f32 ...   # or any all-F32 SmolLM2 GGUF
#   bench/compare_llamacpp.sh /path/smollm2-135m-f32.gguf [build-dir]
#
# llama.cpp runs the all-F32 copy (its F32 path, the fair comparison for our f32 mode); our
# engine loads the default Q4_1 file and dequantizes it to the same f32 weights at load.
set -euo pipefail
cd "$(dirname "$0")/.."
f32_model=${1:?usage: bench/compare_llamacpp.sh F32_GGUF [BUILD_DIR]}
build=${2:-build}
out=$(mktemp -d)
"$build/lp_bench" --benchmark_filter='BM_Prefill' --benchmark_format=json >"$out/lp.json"
python3 bench/llamacpp_prefill.py --model "$f32_model" --tokens 512,2048,4096 --threads 2 --reps 2 >"$out/llama.jsonl"
python3 - "$out/lp.json" "$out/llama.jsonl" <<'PY'
import json, sys
lp = json.load(open(sys.argv[1]))["benchmarks"]
llama = {r["tokens"]: r for r in map(json.loads, open(sys.argv[2]))}
print(f"{'tokens':>7} {'llama.cpp f32':>14} {'lp f32':>10} {'ratio':>6} {'lp bf16':>10} {'ratio':>6}")
for n in sorted(llama):
    ref = llama[n]["tok_per_s_best"]
    row = {b["name"].split("/")[1]: b["tokens/s"] for b in lp if b["name"].split("/")[2] == str(n)}
    f32, bf16 = row.get("f32", 0), row.get("bf16", 0)
    print(f"{n:>7} {ref:>12.1f}/s {f32:>8.1f}/s {f32/ref:>5.2f}x {bf16:>8.1f}/s {bf16/ref:>5.2f}x")
PY
