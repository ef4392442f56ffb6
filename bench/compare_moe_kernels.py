#!/usr/bin/env python3
"""The simulator's MoE layer beside TensorRT-LLM's measured one.

tests/fixtures/published/aiconfigurator_moe_h200.json holds NVIDIA aiconfigurator's collected
timings of TensorRT-LLM 1.2.0rc5's MoE op on one H200 (routing, the routed experts, their combine;
tokens routed uniformly; no TP or EP) for the expert shapes of Qwen3-30B-A3B, Qwen3-235B-A22B,
Mixtral 8x7B, DeepSeek-V3 and gpt-oss. For each row this runs `lazyprefill simulate` on a one-layer
model of that shape (a prefill of num_tokens rows: the router and experts ops are the MoE layer)
on the h200 profile with the TensorRT-LLM engine preset, and prints predicted/measured; then the
mean |ln(predicted/measured)| per shape and over every fp8 row.

    bench/compare_moe_kernels.py [--lazyprefill build/lazyprefill] [--hw h200] [--max-fp8-error F]

--max-fp8-error F exits 1 when the fp8 rows' mean |ln ratio| passes F (a regression guard for the
test suite; docs/simulator.md keeps the figures).
"""
import argparse
import json
import math
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/published/aiconfigurator_moe_h200.json"
TYPES = {"fp8": ["--weights", "fp8", "--compute", "fp8", "--kv", "fp8"],
         "w4a16_mxfp4": ["--weights", "bf16", "--expert-weights", "mxfp4", "--compute", "bf16", "--kv", "bf16"]}


def one_layer(tmp, r):
    """A one-layer model with this row's experts (8 heads of 128 and a 32-token vocabulary: the
    attention and head around them do not enter the comparison)."""
    c = {"arch": "qwen3moe", "name": "moe-layer", "n_layer": 1, "n_embd": r["hidden_size"], "n_head": 8,
         "n_head_kv": 8, "head_dim": 128, "n_ff": r["inter_size"], "n_vocab": 32, "n_ctx_train": 1 << 20,
         "n_expert": r["num_experts"], "n_expert_used": r["topk"], "n_ff_exp": r["inter_size"]}
    path = pathlib.Path(tmp) / f"moe-{r['hidden_size']}-{r['inter_size']}-{r['topk']}-{r['num_experts']}.json"
    path.write_text(json.dumps(c))
    return str(path)


def predicted_ms(exe, hw, config, r):
    args = [exe, "simulate", "--model-config", config, "--hw", hw, "--engine", "trtllm",
            "--prompt-tokens", str(r["num_tokens"]), "--json", *TYPES[r["moe_dtype"]]]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"compare_moe_kernels: {' '.join(args[1:])}: {out.stderr.strip()}")
    ops = json.loads(out.stdout)["results"][0]["prefill_ops"]
    return ops["router"]["time_ms"] + ops["experts"]["time_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--lazyprefill", default=str(ROOT / "build/lazyprefill"))
    ap.add_argument("--hw", default="h200")
    ap.add_argument("--max-fp8-error", type=float, default=None)
    a = ap.parse_args()
    rows = json.loads(FIXTURE.read_text())["rows"]
    shapes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:
            key = (r["moe_dtype"], r["hidden_size"], r["inter_size"], r["num_experts"], r["topk"])
            ratio = predicted_ms(a.lazyprefill, a.hw, one_layer(tmp, r), r) / r["latency"]
            shapes.setdefault(key, []).append((r["num_tokens"], ratio))
    print("dtype        D/F_e      experts top-k  predicted/measured at 1, 8, 32, ... 16384 tokens   mean |ln|")
    fp8 = []
    for (dtype, d, f, e, k), pts in shapes.items():
        logs = [abs(math.log(q)) for _, q in pts]
        if dtype == "fp8":
            fp8 += logs
        print(f"{dtype:<12} {d}/{f:<6} {e:>7} {k:>5}  {' '.join(f'{q:.2f}' for _, q in pts):<48} "
              f"{sum(logs) / len(logs):.3f}")
    mean = sum(fp8) / len(fp8)
    print(f"fp8 rows: {len(fp8)}, mean |ln(predicted/measured)| {mean:.3f}")
    if a.max_fp8_error is not None and mean > a.max_fp8_error:
        print(f"compare_moe_kernels: the fp8 rows' mean |ln ratio| {mean:.3f} exceeds {a.max_fp8_error}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
