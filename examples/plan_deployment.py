#!/usr/bin/env python3
"""Plan a deployment with lazyprefill from Python, then plot TTFT against the arrival rate.

For a model and a workload, each candidate GPU (one engine per GPU) is searched for the highest
arrival rate it serves within the latency objectives, with and without LazyLLM; the plan is the
fewest GPUs that carry the target rate. The chosen GPU's TTFT p50 and p90 are then simulated over
a range of rates and plotted (matplotlib, if installed; else the table alone).

  PYTHONPATH=build/python ~/.cache/lazyprefill/venv/bin/python examples/plan_deployment.py \\
      --model-config llama-3.1-8b --hw h100-sxm,a100-80gb,l4 --target-rate 20 --out ttft.png

docs/python.md; python/tests/test_examples.py keeps it working.
"""
import argparse
import math
import sys

import lazyprefill as lp


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-config", default="llama-3.1-8b")
    ap.add_argument("--hw", default="h100-sxm,a100-80gb,l4", help="candidate GPUs, comma-separated")
    ap.add_argument("--prompt-tokens", default="4096:12288")
    ap.add_argument("--output-tokens", default="128")
    ap.add_argument("--slo-ttft-p90-ms", type=float, default=1500)
    ap.add_argument("--slo-itl-p90-ms", type=float, default=50)
    ap.add_argument("--target-rate", type=float, default=20, help="requests/s the deployment must carry")
    ap.add_argument("--kv-budget-mib", type=float, default=30000)
    ap.add_argument("--requests", type=int, default=500, help="requests per simulated run")
    ap.add_argument("--out", default="ttft_vs_rate.png", help="the plot (PNG)")
    a = ap.parse_args()

    common = dict(model_config=a.model_config, prompt_tokens=a.prompt_tokens, output_tokens=a.output_tokens,
                  kv_budget_mib=a.kv_budget_mib, requests=a.requests, prune="none,lazyllm")
    try:
        cap = lp.simulate_serving(hw=a.hw, capacity=True, slo_ttft_p90_ms=a.slo_ttft_p90_ms,
                                  slo_itl_p90_ms=a.slo_itl_p90_ms, seeds=1, tolerance=0.05, **common)
    except lp.Error as e:  # the CLI's one line
        sys.exit(f"plan_deployment: {e}")

    print(f"{a.model_config}, prompts {a.prompt_tokens}, outputs {a.output_tokens}: p90 TTFT <= "
          f"{a.slo_ttft_p90_ms:g} ms, p90 ITL <= {a.slo_itl_p90_ms:g} ms, {a.target_rate:g} req/s")
    print(f"{'GPU':<12} {'method':<8} {'req/s per GPU':>14} {'GPUs':>6}")
    plan = None
    for c in cap.capacities:
        gpus = math.ceil(a.target_rate / c.rate) if c.met and c.rate > 0 else None
        print(f"{c.hw:<12} {c.method:<8} {c.rate if c.met else float('nan'):>14.3g} {gpus or '-':>6}")
        if gpus and (plan is None or gpus < plan[2]):
            plan = (c.hw, c.method, gpus, c.rate)
    if plan is None:
        sys.exit("plan_deployment: no candidate meets the objectives at any rate")
    hw, method, gpus, per_gpu = plan
    print(f"plan: {gpus} x {hw} with {method} ({per_gpu:.3g} req/s each)")

    # TTFT against the rate on one GPU of the plan, both methods, up to past its capacity.
    rates = [per_gpu * f for f in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)]
    sweep = lp.simulate_serving(hw=hw, rate=rates, **common)
    curves = {}
    for run in sweep.runs:
        curves.setdefault(run.method, []).append((run.rate, run.metrics.ttft.p50, run.metrics.ttft.p90))
    print(f"{'method':<8} {'req/s':>8} {'TTFT p50 ms':>12} {'p90 ms':>9}")
    for method, points in curves.items():
        for rate, p50, p90 in points:
            print(f"{method:<8} {rate:>8.3g} {p50 * 1e3:>12.1f} {p90 * 1e3:>9.1f}")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (method, points) in enumerate(curves.items()):
        r = [p[0] for p in points]
        ax.plot(r, [p[1] * 1e3 for p in points], color=f"C{i}", marker="o", label=f"{method} p50")
        ax.plot(r, [p[2] * 1e3 for p in points], color=f"C{i}", marker="s", linestyle="--", label=f"{method} p90")
    ax.axhline(a.slo_ttft_p90_ms, color="grey", linewidth=0.8, label="p90 objective")
    ax.set_xlabel("arrival rate, requests/s (one GPU)")
    ax.set_ylabel("TTFT, ms")
    ax.set_yscale("log")
    ax.set_title(f"{a.model_config} on {hw} (lazyprefill {lp.__version__}, simulated)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"plot: {a.out}")


if __name__ == "__main__":
    main()
