#!/usr/bin/env python3
"""The Python module's call overhead: lazyprefill.simulate from a Python loop beside the same
request through the C++ library (lp_bench's BM_SimulateCall), alternated, medians.

  PYTHONPATH=build/python ~/.cache/lazyprefill/venv/bin/python bench/python_simulate.py \
      --lp-bench build/lp_bench [--calls 10000] [--reps 3]

Builds nothing: `cmake --build build --target lp_bench` first. For each case (llama-3.1-8b,
LazyLLM's default schedule, 8,192 prompt tokens, 0 or 64 generated, on an H100 given as a loaded
Profile or by name) it prints the C++ call's time, the Python call's, the overhead as a share of
the C++ call, and the time of `--calls` calls from Python. The issue's budget (57): overhead under
5%, 10,000 calls under 10 s.
"""
import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import lazyprefill as lp

CASES = [(8192, 0, 0), (8192, 0, 1), (8192, 64, 0), (8192, 64, 1)]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpp_times(lp_bench):
    """Microseconds per call for each case, from one lp_bench run."""
    out = subprocess.run([lp_bench, "--benchmark_filter=BM_SimulateCall", "--benchmark_format=json",
                          "--benchmark_min_time=0.5"], capture_output=True, text=True, check=True).stdout
    times = {}
    for b in json.loads(out)["benchmarks"]:
        args = dict(kv.split(":") for kv in b["name"].split("/")[1:])
        times[(int(args["prompt"]), int(args["new"]), int(args["by_name"]))] = b["real_time"]
    return times


def python_time(case, calls):
    prompt, new, by_name = case
    hw = "h100-sxm" if by_name else lp.Profile.load("h100-sxm")
    t0 = time.perf_counter()
    for _ in range(calls):
        lp.simulate(model_config="llama-3.1-8b", hw=hw, prune="lazyllm", prompt_tokens=prompt, new_tokens=new)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lp-bench", required=True, help="build/lp_bench")
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if a.calls < 1 or a.reps < 1:
        sys.exit("python_simulate: --calls and --reps must be at least 1")
    print(f"CPU: {cpu_model()}; lazyprefill {lp.__version__}; Python {platform.python_version()}")
    cpp = {c: [] for c in CASES}
    py = {c: [] for c in CASES}
    for _ in range(a.reps):  # A and B alternated
        for c, t in cpp_times(a.lp_bench).items():
            if c in cpp:
                cpp[c].append(t)
        for c in CASES:
            py[c].append(python_time(c, a.calls))
    print(f"{'prompt':>6} {'new':>4} {'hw':>8} {'C++ us':>9} {'Python us':>10} {'overhead':>9} "
          f"{a.calls:,} calls s")
    for c in CASES:
        cu = statistics.median(cpp[c])
        total = statistics.median(py[c])
        pu = total / a.calls * 1e6
        print(f"{c[0]:>6} {c[1]:>4} {'name' if c[2] else 'Profile':>8} {cu:>9.1f} {pu:>10.1f} "
              f"{(pu - cu) / cu:>8.1%} {total:>10.2f}")


if __name__ == "__main__":
    main()
