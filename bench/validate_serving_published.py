#!/usr/bin/env python3
"""Predicts published GPU serving figures of dense Llama models and reports the error per metric.

The points (tests/fixtures/published/serving_online.json, sources in
docs/research/published-serving-figures.md) are run through `lazyprefill simulate-serving` as their
source ran them, with the engine preset of the engine that made them:

- TensorRT-LLM's performance overview (trtllm-bench, offline maximum throughput, Llama-3.1-8B and
  Llama-3.3-70B on H100, H200 and B200): every request at once, trtllm-bench's own batch limits
  (validate_published.trtllm_bench_limits), 0.95 of the memory the weights leave for K/V;
- NVIDIA NIM 1.8.0's Llama-3.3-70B table (2 x H100, fp8, TP 2, 5,000 + 500 tokens, AIPerf at
  concurrency 1-250): a closed loop of that many clients (`--concurrency`), the TensorRT-LLM
  preset (NIM's engine on H100), 0.9 of the memory the weights leave.

Printed per point: the prediction, the published figure and the error, uncalibrated; then per
source and metric the mean absolute error uncalibrated and calibrated on one point (the
prediction scaled by another point's published / predicted ratio of the same source, model, GPU
and metric, the mean over every choice of that point: leave one out).

    bench/validate_serving_published.py [--lazyprefill build/lazyprefill] [--markdown]
"""
import argparse
import json
import math
import pathlib
import os
import re
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import validate_published as vp  # noqa: E402  (its layout and trtllm-bench helpers)

FIXTURE = ROOT / "tests/fixtures/published/serving_online.json"
MODELS = {"llama-3.1-8b-instruct": "llama-3.1-8b", "llama-3.3-70b-instruct": "llama-3.1-70b",
          "meta/llama-3.3-70b-instruct": "llama-3.1-70b"}


def hw_of(gpu):
    g = gpu.lower()
    for key, name in (("b200", "b200"), ("h200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80gb")):
        if key in g:
            return name
    return None


def types_of(precision):
    if precision.startswith("fp4"):
        return {"weights": "fp4", "compute": "fp4", "kv": "fp8"}
    if precision.startswith("fp8"):
        return {"weights": "fp8", "compute": "fp8", "kv": "fp8"}
    return {"weights": "bf16", "compute": "bf16", "kv": "bf16"}


def base_point(q):
    model = MODELS.get(q["model"].lower())
    hw = hw_of(q["gpu"])
    if not model or not hw or not q.get("tp"):
        return None
    return dict(model=model, hw=hw, tp=q["tp"], dp=1, gpus=q["gpus"], **types_of(q["precision"]))


def trtllm_point(exe, q):
    p = base_point(q)
    if not p:
        return None
    m = re.search(r"num_requests=(\d+)", q.get("dataset", ""))
    p.update(isl=q["isl"], osl=q["osl"], requests=min(int(m.group(1)) if m else 3000, 3000))
    return {"throughput": vp.predict(exe, p)}


def nim_point(exe, q, engine=None):
    """NIM's concurrency point simulated; `engine` ({"kernel_scale", "iteration_us"}) calibrates the
    TensorRT-LLM preset (through a profile file that carries it)."""
    p = base_point(q)
    if not p:
        return None
    args = list(vp.layout_args(p))
    sim = vp.layout_json(exe, tuple(args))
    weights = sim["results"][0]["memory_bytes"]["weights"]
    profile = json.loads((ROOT / "hwmodels" / f"{p['hw']}.json").read_text())
    capacity = profile["memory_capacity_gib"] * 2**30
    hkv = sim["config"]["n_head_kv"]
    ratio = hkv / (hkv // p["tp"] if hkv >= p["tp"] else 1)
    budget_mib = ratio * (0.9 * capacity - weights) / 2**20
    if engine:
        profile["name"] = profile["name"] + "-calibrated"
        profile["engine"] = {"preset": "trtllm", **engine}
        path = pathlib.Path(tempfile.gettempdir()) / f"lp-published-{os.getpid()}.json"
        path.write_text(json.dumps(profile))
        i = args.index("--hw")
        args[i + 1] = str(path)
        j = args.index("--engine")
        del args[j:j + 2]
    c = int(q["load"]["value"])
    # Steady state, as the benchmark's measurement windows take it: the first 2c requests (every
    # client sending at once) and the last c (the drain) served but not counted.
    out = vp.run_json(exe, ["simulate-serving", *args, "--prune", "none", "--concurrency", str(c),
                            "--requests", str(max(10 * c, 64)), "--warmup", str(2 * c), "--cooldown", str(c),
                            "--prompt-tokens", str(q["isl"]),
                            "--output-tokens", str(q["osl"]), "--kv-budget-mib", f"{budget_mib:.1f}"])
    m = out["results"][0]["metrics"]
    return {"ttft": m["ttft_ms"]["mean"], "itl": m["itl_ms"]["mean"], "throughput": m["output_tokens_per_s"]}


def fit_engine(exe, q, fit_on):
    """The engine's kernel scale and host time an iteration that best predict one point's figures
    (least squares of the log errors, over a grid), as calibrate-serving fits them from a user's run."""
    pub = published(q)
    best = None
    for scale in (0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4):
        for it_us in (0, 1000, 2000, 3000, 4000, 6000):
            pred = nim_point(exe, q, {"kernel_scale": scale, "iteration_us": it_us})
            err = sum(math.log(pred[k] / v) ** 2 for k, v in pub.items() if k in pred and v and k in fit_on)
            if best is None or err < best[0]:
                best = (err, {"kernel_scale": scale, "iteration_us": it_us})
    return best[1]


def published(q):
    m = q["metrics"]
    out = {}
    if "output_tokens_per_s" in m:
        out["throughput"] = m["output_tokens_per_s"]
    for ours, theirs in (("ttft", "ttft_ms"), ("itl", "itl_ms")):
        if theirs in m:
            v = m[theirs]
            out[ours] = v.get("as_published", v.get("mean"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--lazyprefill", default=str(ROOT / "build/lazyprefill"))
    ap.add_argument("--fixture", default=str(FIXTURE))
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--refit", action="store_true",
                    help="also calibrate NIM's engine on each point by re-simulation (about 10 minutes)")
    ap.add_argument("--fit-on", default="throughput,itl",
                    help="with --refit: the figures the engine is fitted to (default throughput,itl: the "
                    "engine's speed; TTFT under load also depends on how arrivals collide)")
    a = ap.parse_args()
    points = json.loads(pathlib.Path(a.fixture).read_text())["points"]
    rows, refit_rows = [], []
    for q in points:
        if q["source"] == "trtllm_perf_overview":
            pred = trtllm_point(a.lazyprefill, q)
        elif q["source"] == "nim_perf" and q["load"]["kind"] == "concurrency":
            pred = nim_point(a.lazyprefill, q)
        else:
            continue  # MLPerf: dataset-length distributions not in the fixture yet
        if not pred:
            continue
        pub = published(q)
        load = q["load"]["value"]
        key = (q["source"], q["model"], q["gpu"], q["precision"], q["tp"])
        for metric, v in pub.items():
            if metric in pred and v:
                rows.append(dict(key=key, source=q["source"], what=f"{q['model']} {q['gpu']} {q['precision']} "
                                 f"TP{q['tp']} {q['isl']}/{q['osl']} load {load}", metric=metric,
                                 pred=pred[metric], pub=v, err=pred[metric] / v - 1))
    # NIM calibrated on one point by re-simulation: the engine fitted to that point's three figures,
    # every other point of the table predicted with it (each point in turn the calibration point).
    refit = {}
    if a.refit:
        nim = [q for q in points if q["source"] == "nim_perf" and q["load"]["kind"] == "concurrency" and base_point(q)]
        for k, q in enumerate(nim):
            engine = fit_engine(a.lazyprefill, q, tuple(a.fit_on.split(",")))
            for m, other in enumerate(nim):
                if m != k:
                    refit.setdefault(m, []).append((engine, nim_point(a.lazyprefill, other, engine)))
        for m, q in enumerate(nim):
            pub = published(q)
            for metric, v in pub.items():
                errs = [abs(pred[metric] / v - 1) for _, pred in refit.get(m, []) if metric in pred]
                if errs:
                    refit_rows.append(dict(metric=metric, err=statistics.mean(errs)))
    sep = " | " if a.markdown else "  "
    if a.markdown:
        print("| point | metric | predicted | published | error |\n|---|---|---|---|---|")
    for r in rows:
        line = [r["what"], r["metric"], f"{r['pred']:.1f}", f"{r['pub']:.1f}", f"{100 * r['err']:+.1f}%"]
        print(("| " + sep.join(line) + " |") if a.markdown else sep.join(line))
    print()
    groups = {}
    for r in rows:
        groups.setdefault((r["source"], r["metric"]), []).append(r)
    for (source, metric), rs in sorted(groups.items()):
        unc = statistics.mean(abs(r["err"]) for r in rs)
        cal = []
        for r in rs:
            others = [o for o in rs if o is not r and o["key"] == r["key"]]
            if others:
                cal.append(statistics.mean(abs(r["pred"] * (o["pub"] / o["pred"]) / r["pub"] - 1) for o in others))
        cal_s = f"{100 * statistics.mean(cal):.1f}%" if cal else "-"
        print(f"{source} {metric}: {len(rs)} points, mean abs error uncalibrated {100 * unc:.1f}%, "
              f"calibrated on one other point {cal_s}")
    per_group = {}
    for r in rows:
        per_group.setdefault((r["source"], r["key"][1], r["key"][2], r["key"][3], r["metric"]), []).append(r)
    for (source, model, gpu, precision, metric), rs in sorted(per_group.items()):
        print(f"  {source} {model} {gpu} {precision} {metric}: {len(rs)} points, mean error "
              f"{100 * statistics.mean(r['err'] for r in rs):+.1f}%, mean abs "
              f"{100 * statistics.mean(abs(r['err']) for r in rs):.1f}%")
    for metric in ("throughput", "ttft", "itl"):
        errs = [r["err"] for r in refit_rows if r["metric"] == metric]
        if errs:
            print(f"nim_perf {metric}: engine fitted on one other point (kernel scale, iteration time) and "
                  f"re-simulated: mean abs error {100 * statistics.mean(errs):.1f}%")


if __name__ == "__main__":
    main()
