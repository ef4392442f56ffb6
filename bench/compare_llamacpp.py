#!/usr/bin/env python3
"""Side by side with llama.cpp and ik_llama.cpp, in one run: prefill and decode speed on the same GGUF file.

OPTIONAL COMPARISON SCRIPT, NOT RUN BY CI. It needs a llama-bench binary built outside this
repository (any llama.cpp checkout: cmake -B build -DGGML_NATIVE=ON && cmake --build build
--target llama-bench), and optionally ik_llama.cpp's (--ik-llama-bench; the same commands in an
ik_llama.cpp checkout); nothing here builds them.

For each repetition it alternates the engines, so a noisy machine hurts them alike:
  lazyprefill  build/lp_bench BM_Prefill/<dtype>/N (one forward pass over N tokens, fresh KV cache)
               and BM_Decode/<dtype>/512/32 (32 single-token steps after a 512-token prompt), the
               model given by LAZYPREFILL_MODEL;
  llama.cpp    llama-bench -p N -n 0 (prompt processing) and -p 0 -n 32 -d 512 (32 generated tokens
               after a 512-token context), once with its defaults (micro-batch 512, flash attention
               "auto") and once with flash attention on (-fa 1), its fastest CPU setting here;
  ik_llama.cpp llama-bench with its best CPU settings for a K-quant file: flash attention and
               run-time repacking to its row-interleaved quants (-fa 1 -rtr 1); decoding after 512
               tokens is its -gp 512,32 (only the 32 generated tokens timed, as -d 512 -n 32).
Both use --threads threads and random token ids. Prints a table of medians (tokens/s) and the
ratios lazyprefill / llama.cpp, and with --json every sample.

Example (the default model; a Q8_0 copy made with llama-quantize --allow-requantize):
    python3 bench/compare_llamacpp.py --llama-bench ~/llama.cpp/build/bin/llama-bench \\
        --model ~/.cache/lazyprefill/models/SmolLM2-135M-Instruct.Q4_1.gguf --tokens 512,2048,8192
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def llama(bench, model, threads, args):
    cmd = [bench, "-m", model, "-t", str(threads), "-r", "1", "-o", "json"] + args
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"compare_llamacpp: {' '.join(cmd)} failed ({run.returncode}): {run.stderr.strip()[-300:]}")
    rows = json.loads(run.stdout)
    return rows[0]["avg_ts"], rows[0].get("build_commit", "?")


def lp(lp_bench, model, name):
    env = dict(os.environ, LAZYPREFILL_MODEL=model)
    out = subprocess.run([lp_bench, f"--benchmark_filter=^{name}$", "--benchmark_format=json"], check=True,
                         capture_output=True, text=True, env=env).stdout
    rows = [b for b in json.loads(out)["benchmarks"] if b["name"].startswith(name)]
    if not rows:
        sys.exit(f"compare_llamacpp: {lp_bench} has no benchmark {name}")
    if "error_message" in rows[0]:
        sys.exit(f"compare_llamacpp: {name}: {rows[0]['error_message']}")
    return rows[0]["tokens/s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--ik-llama-bench", help="ik_llama.cpp's llama-bench, run with -fa 1 -rtr 1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--lp-bench", default="build/lp_bench")
    ap.add_argument("--dtype", default="int8", choices=["int8", "f32", "bf16"])
    ap.add_argument("--tokens", default="512,2048,8192", help="prompt lengths to prefill, or none (decoding only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--llama-fa", default="both", choices=["both", "default", "on"],
                    help="llama.cpp's runs: with its defaults, with flash attention on (-fa 1), or both")
    a = ap.parse_args()
    if not os.access(a.lp_bench, os.X_OK):
        sys.exit(f"compare_llamacpp: {a.lp_bench} is not built (cmake --build build --target benches)")
    lengths = [] if a.tokens == "none" else [int(t) for t in a.tokens.split(",")]
    if a.ik_llama_bench and not os.access(a.ik_llama_bench, os.X_OK):
        sys.exit(f"compare_llamacpp: {a.ik_llama_bench} is not an executable")
    # (label, prefill args, decoding args) per llama-bench run.
    decode = ["-p", "0", "-n", "32", "-d", "512"]
    engines = [("llama.cpp", a.llama_bench, [], decode)] if a.llama_fa != "on" else []
    if a.llama_fa != "default":
        engines.append(("llama.cpp -fa 1", a.llama_bench, ["-fa", "1"], decode))
    if a.ik_llama_bench:
        engines.append(("ik_llama.cpp -fa 1 -rtr 1", a.ik_llama_bench, ["-fa", "1", "-rtr", "1"],
                        ["-gp", "512,32", "-n", "0", "-p", "0"]))
    cases = [(f"pp{n}", f"BM_Prefill/{a.dtype}/{n}/min_time:2.000/real_time", ["-p", str(n), "-n", "0"])
             for n in lengths]
    cases.append(("tg32@512", f"BM_Decode/{a.dtype}/512/32/real_time", None))
    samples = {c[0]: {k: [] for k in ["lazyprefill"] + [e[0] for e in engines]} for c in cases}
    commits = {}
    for rep in range(a.reps):
        for label, lp_name, largs in cases:
            samples[label]["lazyprefill"].append(lp(a.lp_bench, a.model, lp_name))
            for name, bench, extra, dargs in engines:
                ts, commits[name] = llama(bench, a.model, a.threads, (largs or dargs) + extra)
                samples[label][name].append(ts)
            print(f"rep {rep + 1}/{a.reps} {label}: " +
                  ", ".join(f"{k} {v[-1]:.1f}" for k, v in samples[label].items()), file=sys.stderr)
    print(f"model {os.path.basename(a.model)}, {a.threads} threads, lazyprefill --dtype {a.dtype}, " +
          ", ".join(f"{n} {c}" for n, c in commits.items()) + f"; medians of {a.reps} (tokens/s; ratio: lazyprefill's)")
    print(f"{'case':>9} {'lazyprefill':>12} " + " ".join(f"{e[0]:>26} {'ratio':>6}" for e in engines))
    for label, _, _ in cases:
        m = {k: statistics.median(v) for k, v in samples[label].items()}
        print(f"{label:>9} {m['lazyprefill']:>12.1f} " +
              " ".join(f"{m[e[0]]:>26.1f} {m['lazyprefill'] / m[e[0]]:>5.2f}x" for e in engines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "commits": commits, "threads": a.threads, "dtype": a.dtype,
                       "samples": samples}, f, indent=1)


if __name__ == "__main__":
    main()
