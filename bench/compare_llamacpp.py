#!/usr/bin/env python3
"""Side by side with llama.cpp and ik_llama.cpp, in one run: prefill and decode speed on the same GGUF file.

OPTIONAL COMPARISON SCRIPT, NOT RUN BY CI. It needs a llama-bench binary built outside this
repository (any llama.cpp checkout: cmake -B build -DGGML_NATIVE=ON && cmake --build build
--target llama-bench), and optionally ik_llama.cpp's (--ik-llama-bench; the same commands in an
ik_llama.cpp checkout); nothing here builds them.

For each repetition it alternates the engines, so a noisy machine hurts them alike:
  lazyprefill  build/lp_bench BM_Prefill/<dtype>/N (one forward pass over N tokens, fresh KV cache)
               and BM_Decode/<dtype>/D/32 (32 single-token steps after a D-token prompt, D in
               --depths), the model given by LAZYPREFILL_MODEL;
  llama.cpp    llama-bench -p N -n 0 (prompt processing) and -p 0 -n 32 -d D (32 generated tokens
               after a D-token context), once with its defaults (micro-batch 512, flash attention
               "auto") and once with flash attention on (-fa 1), its fastest CPU setting here;
  ik_llama.cpp llama-bench with its best CPU settings for a K-quant file: flash attention and
               run-time repacking to its row-interleaved quants (-fa 1 -rtr 1); decoding after D
               tokens is its -gp D,32 (only the 32 generated tokens timed, as -d D -n 32).
Both use --threads threads and random token ids. Prints a table of medians (tokens/s) and the
ratios lazyprefill / llama.cpp, and with --json every sample.

Beside them, the machine's own limits, measured by lp_bench before the first repetition and after
the last (these VMs' bandwidth moves between runs): the CPU model, the read ceiling
(BM_MemBandwidth/0, the better of 4 KiB and huge pages) and the int8 peak (BM_Peak_Vnni512, else
BM_Peak_Vnni256, else on AVX2 paths BM_Peak_Avx2Int8). Each decoding row adds every engine's share of the read ceiling: the bytes a step
reads (lazyprefill's MB/token for the file and context: the weights and the f16 K/V, which
llama.cpp's default cache type also is) at that engine's tokens/s; each prefill row adds
lazyprefill's share of the int8 peak (BM_Prefill's GFLOP/s).

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


def lp_rows(lp_bench, regex, model=None):
    """lp_bench's JSON rows for the benchmarks matching regex (rows that report an error included)."""
    env = dict(os.environ, LAZYPREFILL_MODEL=model) if model else None
    run = subprocess.run([lp_bench, f"--benchmark_filter={regex}", "--benchmark_format=json"],
                         capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"compare_llamacpp: {lp_bench} --benchmark_filter={regex} failed ({run.returncode}): "
                 f"{run.stderr.strip()[-300:]}")
    return json.loads(run.stdout)["benchmarks"]


def lp(lp_bench, model, name):
    """One lazyprefill benchmark's counters (tokens/s, and MB/token or GFLOP/s where it has them)."""
    rows = [b for b in lp_rows(lp_bench, f"^{name}$", model) if b["name"].startswith(name)]
    if not rows:
        sys.exit(f"compare_llamacpp: {lp_bench} has no benchmark {name}")
    if "error_message" in rows[0]:
        sys.exit(f"compare_llamacpp: {name}: {rows[0]['error_message']}")
    return rows[0]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown CPU"
    cpu0 = {}  # the first processor's fields (each "key<tabs>: value" line)
    for line in info.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            cpu0.setdefault(key.strip(), value.strip())
    flags = cpu0.get("flags", "").split()
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_int8") if f in flags]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return (f"{cpu0.get('model name', 'unknown CPU')} (family {cpu0.get('cpu family', '?')} model "
            f"{cpu0.get('model', '?')}; {' '.join(isa) or 'no AVX2'})" +
            (f"; lazyprefill's kernels capped by ONEDNN_MAX_CPU_ISA={cap}" if cap else ""))


def machine_limits(lp_bench):
    """(read ceiling GB/s, int8 peak Gop/s or None) as lp_bench measures them now (the Peak benchmarks'
    "Gop/s" counter is a rate in operations a second)."""
    ceiling = max(r["GB/s"] for r in lp_rows(lp_bench, "^BM_MemBandwidth/0/") if "GB/s" in r)
    peaks = {r["name"].split("/")[0]: r["Gop/s"] / 1e9
             for r in lp_rows(lp_bench, "^BM_Peak_(Vnni256|Vnni512|Avx2Int8)/") if "Gop/s" in r}
    return ceiling, peaks.get("BM_Peak_Vnni512", peaks.get("BM_Peak_Vnni256", peaks.get("BM_Peak_Avx2Int8")))


def write_atomically(path, obj):
    """obj as JSON at path, or the file left as it was: written beside it, then renamed over it."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        sys.exit(f"compare_llamacpp: --json {path}: {e.strerror}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--ik-llama-bench", help="ik_llama.cpp's llama-bench, run with -fa 1 -rtr 1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--lp-bench", default="build/lp_bench")
    ap.add_argument("--dtype", default="int8", choices=["int8", "f32", "bf16"])
    ap.add_argument("--tokens", default="512,2048,8192", help="prompt lengths to prefill, or none (decoding only)")
    ap.add_argument("--depths", default="512",
                    help="contexts to decode 32 tokens after (lp_bench has BM_Decode at 512 and 4096), or none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--llama-fa", default="both", choices=["both", "default", "on"],
                    help="llama.cpp's runs: with its defaults, with flash attention on (-fa 1), or both")
    a = ap.parse_args()
    if not os.access(a.lp_bench, os.X_OK):
        sys.exit(f"compare_llamacpp: {a.lp_bench} is not built (cmake --build build --target benches)")
    try:
        lengths = [] if a.tokens == "none" else [int(t) for t in a.tokens.split(",")]
        depths = [] if a.depths == "none" else [int(d) for d in a.depths.split(",")]
    except ValueError:
        sys.exit(f"compare_llamacpp: --tokens {a.tokens} / --depths {a.depths}: not comma-separated integers")
    if any(n <= 0 for n in lengths + depths):
        sys.exit("compare_llamacpp: --tokens and --depths must be positive")
    if a.ik_llama_bench and not os.access(a.ik_llama_bench, os.X_OK):
        sys.exit(f"compare_llamacpp: {a.ik_llama_bench} is not an executable")
    # (label, llama-bench's extra args, its decoding args for context d) per engine.
    def llama_decode(d):
        return ["-p", "0", "-n", "32", "-d", str(d)]

    engines = [("llama.cpp", a.llama_bench, [], llama_decode)] if a.llama_fa != "on" else []
    if a.llama_fa != "default":
        engines.append(("llama.cpp -fa 1", a.llama_bench, ["-fa", "1"], llama_decode))
    if a.ik_llama_bench:
        engines.append(("ik_llama.cpp -fa 1 -rtr 1", a.ik_llama_bench, ["-fa", "1", "-rtr", "1"],
                        lambda d: ["-gp", f"{d},32", "-n", "0", "-p", "0"]))
    # (label, lp_bench's benchmark, prompt length or None, decoding context or None)
    cases = [(f"pp{n}", f"BM_Prefill/{a.dtype}/{n}/min_time:2.000/real_time", n, None) for n in lengths]
    cases += [(f"tg32@{d}", f"BM_Decode/{a.dtype}/{d}/32/real_time", None, d) for d in depths]
    samples = {c[0]: {k: [] for k in ["lazyprefill"] + [e[0] for e in engines]} for c in cases}
    extra = {c[0]: [] for c in cases}  # lazyprefill's MB/token (decoding) or GFLOP/s (prefill)
    commits = {}
    cpu = cpu_model()
    print(f"compare_llamacpp: {cpu}; measuring the read ceiling and int8 peak", file=sys.stderr)
    limits = [machine_limits(a.lp_bench)]
    for rep in range(a.reps):
        for label, lp_name, n, d in cases:
            row = lp(a.lp_bench, a.model, lp_name)
            samples[label]["lazyprefill"].append(row["tokens/s"])
            extra[label].append(row.get("MB/token" if d else "GFLOP/s", 0.0))
            for name, bench, fa, dargs in engines:
                ts, commits[name] = llama(bench, a.model, a.threads, (["-p", str(n), "-n", "0"] if n else dargs(d)) + fa)
                samples[label][name].append(ts)
            print(f"rep {rep + 1}/{a.reps} {label}: " +
                  ", ".join(f"{k} {v[-1]:.1f}" for k, v in samples[label].items()), file=sys.stderr)
    limits.append(machine_limits(a.lp_bench))
    ceiling = max(c for c, _ in limits)
    peaks = [p for _, p in limits if p]
    peak = max(peaks) if peaks else None
    print(f"{cpu}, {a.threads} threads")
    print("read ceiling " + " / ".join(f"{c:.1f}" for c, _ in limits) + " GB/s (before / after; shares use "
          f"the higher), int8 peak " + (" / ".join(f"{p:.0f}" for p in peaks) + " Gop/s" if peaks else "none"))
    print(f"model {os.path.basename(a.model)}, lazyprefill --dtype {a.dtype}, " +
          ", ".join(f"{n} {c}" for n, c in commits.items()) + f"; medians of {a.reps} (tokens/s; ratio: lazyprefill's)")
    print(f"{'case':>10} {'lazyprefill':>12} " + " ".join(f"{e[0]:>26} {'ratio':>6}" for e in engines))
    shares = {}
    for label, _, n, d in cases:
        m = {k: statistics.median(v) for k, v in samples[label].items()}
        print(f"{label:>10} {m['lazyprefill']:>12.1f} " +
              " ".join(f"{m[e[0]]:>26.1f} {m['lazyprefill'] / m[e[0]]:>5.2f}x" for e in engines))
        x = statistics.median(extra[label])
        if d and x > 0:  # each engine's tokens/s x the bytes a step reads, over the ceiling
            shares[label] = {k: v * x / 1e3 / ceiling for k, v in m.items()}
            print(f"{'':>10} of the read ceiling ({x:.0f} MB a step): " +
                  ", ".join(f"{k} {v:.2f}" for k, v in shares[label].items()))
            if max(shares[label].values()) > 1:
                print(f"{'':>10} (over 1: the ceiling was measured while memory was slower than during "
                      "the run; compare the engines' tokens/s, not these shares)")
        elif n and x > 0 and peak:
            shares[label] = {"lazyprefill": x / peak}
            print(f"{'':>10} lazyprefill at {x:.0f} GFLOP/s, {x / peak:.2f} of the int8 peak")
    if a.json:
        write_atomically(a.json, {"cpu": cpu, "model": a.model, "commits": commits, "threads": a.threads,
                                  "dtype": a.dtype, "limits": [{"read_GB/s": c, "int8_Gop/s": p} for c, p in limits],
                                  "samples": samples, "lazyprefill_extra": extra, "shares": shares})


if __name__ == "__main__":
    main()
