#!/usr/bin/env python3
"""Predicts published offline throughput figures of MoE and MLA models and reports the error.

Each point of the fixture (tests/fixtures/published/moe_offline_throughput.json: trtllm-bench
tables of Mixtral, Qwen3-MoE, DeepSeek-R1 and gpt-oss at fixed input/output lengths, every request
sent at once) is run through `lazyprefill simulate-serving` as the source ran it: the profile's
GPUs with the TensorRT-LLM engine preset, the layout (--tp, or --dp for attention data
parallelism with the experts over every GPU), the weight/compute/KV types, that many requests at
an unbounded rate, a K/V budget of 0.95 of the memory the weights leave
(--kv_cache_free_gpu_mem_fraction 0.95), and the batch limits trtllm-bench sets itself when the
command gives none (trtllm_bench_limits: its calc_engine_setting and finetune_setting in
tensorrt_llm/bench/build/tuning.py, read at NVIDIA/TensorRT-LLM, restated here as arithmetic).

Printed per point: the prediction, the published figure and the error uncalibrated; and the
error once calibrated on one other point of the same model and GPU (the prediction scaled by that
point's published/predicted ratio; the mean over every choice of that point: leave-one-out).
Then the mean absolute errors per model family. docs/simulator.md keeps the table.

    bench/validate_published.py [--lazyprefill build/lazyprefill] [--markdown] [--max-mean-error F]
                                [--model NAME]... [--hw PROFILE]...

--max-mean-error F and --max-calibrated-error F exit 1 when any family's mean absolute error,
uncalibrated or calibrated, exceeds F (regression guards for the test suite; the goals are in
docs/simulator.md).
"""
import argparse
import functools
import json
import math
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/published/moe_offline_throughput.json"
KV_FRACTION = 0.95
WEIGHT_BYTES = {"fp8": 1.0, "fp4": 0.5, "mxfp4": 0.5}  # trtllm-bench's bytes per element; anything else 2


def run_json(exe, args):
    r = subprocess.run([exe, *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"validate_published: {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def layout_args(p):
    args = ["--model-config", p["model"], "--hw", p["hw"], "--engine", "trtllm", "--tp", str(p["tp"]),
            "--weights", p["weights"], "--compute", p["compute"], "--kv", p["kv"]]
    if "expert_weights" in p:
        args += ["--expert-weights", p["expert_weights"]]
    if p["dp"] > 1:
        args += ["--dp", str(p["dp"])]
    return args


def trtllm_bench_limits(p, config, capacity_gib):
    """max_batch_size and max_num_tokens as trtllm-bench derives them for a dataset of one ISL/OSL.

    Its K/V estimate: 2 x layers x max(tp, KV heads) x head size x K/V bytes a token, all GPUs'
    memory less the parameters at the weight type's bytes, 0.95 of that; the requests that fit at
    ISL + OSL, at most 4,096 (over the pipeline stages); max_num_tokens that many times (1 + ISL/OSL),
    at most 32,768; both rounded up (batch: to 32 below 256 and at least 64, to 128 below 1,024, else
    to 256; tokens: to 256 below 4,096 and at least 2,048, to 512 below 8,192, else to 1,024).
    """
    gpus = p["gpus"]
    head = config.get("head_dim") or config["n_embd"] // config["n_head"]
    per_token = 2 * config["n_layer"] * max(gpus, config["n_head_kv"]) * head * WEIGHT_BYTES.get(p["kv"], 2)
    experts = expert_params(config) if "expert_weights" in p else 0
    weight_bytes = (config["n_params"] - experts) * WEIGHT_BYTES.get(p["weights"], 2) + \
        experts * WEIGHT_BYTES.get(p.get("expert_weights"), 2)
    available = capacity_gib * gpus * 2**30 - weight_bytes
    fit = KV_FRACTION * available / (per_token * (p["isl"] + p["osl"]))
    bs = min(fit, 4096)
    tokens = min(bs * (1 + p["isl"] / p["osl"]), 32768)
    if bs < 256:
        bs = max(64, 32 * math.ceil(bs / 32))
    elif bs < 1024:
        bs = 128 * math.ceil(bs / 128)
    else:
        bs = 256 * math.ceil(bs / 256)
    if tokens < 4096:
        tokens = max(2048, 256 * math.ceil(tokens / 256))
    elif tokens < 8192:
        tokens = 512 * math.ceil(tokens / 512)
    else:
        tokens = 1024 * math.ceil(tokens / 1024)
    return int(bs), int(tokens)


def expert_params(config):
    """The routed and shared experts' matrices (what --expert-weights stores), from the configuration."""
    moe_layers = config["n_layer"] - config.get("n_layer_dense_lead", 0)
    d = config["n_embd"]
    per_layer = config["n_expert"] * 3 * d * config["n_ff_exp"] + \
        config.get("n_expert_shared", 0) * 3 * d * config.get("n_ff_shexp", 0)
    return moe_layers * per_layer


@functools.lru_cache(maxsize=None)
def layout_json(exe, args):
    """`simulate --json` of one token on a layout: one GPU's weights and the costed configuration
    (asked once for the points that share a model, GPU and layout)."""
    return run_json(exe, ["simulate", *args, "--prompt-tokens", "1"])


def predict(exe, p):
    """Whole-system output tokens/s the serving simulation predicts for point p."""
    sim = layout_json(exe, tuple(layout_args(p)))
    weights = sim["results"][0]["memory_bytes"]["weights"]
    capacity_gib = json.loads((ROOT / "hwmodels" / f"{p['hw']}.json").read_text())["memory_capacity_gib"]
    capacity = capacity_gib * 2**30
    config = dict(sim["config"], n_params=sim["n_params"])
    max_seqs, max_tokens = trtllm_bench_limits(p, config, capacity_gib)
    # One GPU's K/V memory as its tensor-parallel group's budget: reservations count every K/V head,
    # a GPU holds 1/tp of them (fewer heads than GPUs: one each; latent attention: all of it).
    hkv = config["n_head_kv"]
    ratio = 1 if config.get("kv_lora_rank", 0) > 0 else hkv / (hkv // p["tp"] if hkv >= p["tp"] else 1)
    budget_mib = ratio * KV_FRACTION * (capacity - weights) / 2**20
    if budget_mib <= 0:
        sys.exit(f"validate_published: {p['model']} on {p['hw']}: the weights leave no memory for K/V")
    out = run_json(exe, ["simulate-serving", *layout_args(p), "--prune", "none", "--rate", "1e9",
                         "--requests", str(p["requests"]), "--prompt-tokens", str(p["isl"]),
                         "--output-tokens", str(p["osl"]), "--max-batch-tokens", str(max_tokens),
                         "--max-seqs", str(max_seqs),
                         "--kv-budget-mib", f"{budget_mib:.1f}"])
    return out["results"][0]["metrics"]["output_tokens_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--lazyprefill", default=str(ROOT / "build/lazyprefill"))
    ap.add_argument("--fixture", default=str(FIXTURE))
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("--max-mean-error", type=float, default=None)
    ap.add_argument("--max-calibrated-error", type=float, default=None)
    ap.add_argument("--model", action="append", help="only this model's points (repeatable)")
    ap.add_argument("--hw", action="append", help="only this profile's points (repeatable)")
    a = ap.parse_args()
    doc = json.loads(pathlib.Path(a.fixture).read_text())
    points = [p for p in doc["points"]
              if (not a.model or p["model"] in a.model) and (not a.hw or p["hw"] in a.hw)]
    if not points:
        sys.exit("validate_published: no point of the fixture matches --model/--hw")
    for p in points:
        p["predicted"] = predict(a.lazyprefill, p)
        p["ratio"] = p["predicted"] / p["output_tokens_per_s"]
    groups = {}
    for i, p in enumerate(points):
        groups.setdefault((p["model"], p["hw"]), []).append(i)
    for i, p in enumerate(points):
        others = [j for j in groups[(p["model"], p["hw"])] if j != i]
        # Calibrated on point j: this prediction divided by j's predicted/published ratio.
        p["calibrated"] = statistics.fmean(abs(p["ratio"] / points[j]["ratio"] - 1) for j in others) if others else None

    sep = " | " if a.markdown else "  "
    head = ["source", "model", "GPUs", "layout", "ISL/OSL", "published", "predicted", "error", "calibrated"]
    rows = []
    for p in points:
        layout = f"DP{p['dp']}+EP" if p["dp"] > 1 else f"TP{p['tp']}"
        types = p["weights"] + (f"+{p['expert_weights']}" if "expert_weights" in p else "")
        rows.append([p["source"], p["model"], f"{p['gpus']}x {p['hw']}", f"{layout} {types}",
                     f"{p['isl']}/{p['osl']}", f"{p['output_tokens_per_s']:.0f}", f"{p['predicted']:.0f}",
                     f"{100 * (p['ratio'] - 1):+.1f}%",
                     "-" if p["calibrated"] is None else f"{100 * p['calibrated']:.1f}%"])
    fam = {}
    for p in points:
        fam.setdefault(p["model"], []).append(p)
    summary = []
    worst = worst_cal = 0.0
    for model, ps in fam.items():
        unc = statistics.fmean(abs(p["ratio"] - 1) for p in ps)
        cal = [p["calibrated"] for p in ps if p["calibrated"] is not None]
        worst = max(worst, unc)
        worst_cal = max(worst_cal, statistics.fmean(cal) if cal else 0.0)
        summary.append([model, str(len(ps)), f"{100 * unc:.1f}%",
                        f"{100 * statistics.fmean(cal):.1f}%" if cal else "-"])
    allu = statistics.fmean(abs(p["ratio"] - 1) for p in points)
    allc = statistics.fmean(p["calibrated"] for p in points if p["calibrated"] is not None)
    summary.append(["all", str(len(points)), f"{100 * allu:.1f}%", f"{100 * allc:.1f}%"])

    def table(h, rs):
        if a.markdown:
            print("| " + " | ".join(h) + " |")
            print("|" + "---|" * len(h))
            for r in rs:
                print("| " + " | ".join(r) + " |")
        else:
            w = [max(len(x) for x in col) for col in zip(h, *rs)]
            for r in [h, *rs]:
                print(sep.join(x.rjust(n) if k >= 5 else x.ljust(n) for k, (x, n) in enumerate(zip(r, w))))
        print()

    table(head, rows)
    table(["model", "points", "mean abs error uncalibrated", "calibrated on one point (leave-one-out)"], summary)
    failed = False
    for limit, value, what in [(a.max_mean_error, worst, "uncalibrated"), (a.max_calibrated_error, worst_cal, "calibrated")]:
        if limit is not None and value > limit:
            print(f"validate_published: a family's mean {what} error {100 * value:.1f}% exceeds {100 * limit:.1f}%",
                  file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
