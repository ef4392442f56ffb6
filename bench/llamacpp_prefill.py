#!/usr/bin/env python3
"""Speed anchor: time llama.cpp prefill through the PyPI package llama-cpp-python.

OPTIONAL COMPARISON SCRIPT, NOT RUN BY CI (needs `pip install llama-cpp-python`).

For each length N in --tokens it creates a context with n_ctx = N + 16,
n_batch = n_ubatch = N, an f32 KV cache and flash attention off, then for each
repetition clears the KV cache and times ONE llama_decode() of N tokens
(positions 0..N-1, logits requested for the last token only). Token ids are
pseudo-random but valid (seeded, drawn from the non-special part of the
vocabulary), or the first N tokens of --text-file if given.

Prints one JSON line per length:
    {"engine": "llama.cpp", "reference": ..., "model": ..., "tokens": N,
     "threads": T, "reps": R, "times_s": [...], "best_s": ..., "median_s": ...,
     "tok_per_s_best": ..., "tok_per_s_median": ..., "cpu_util": [...],
     "load_avg_1m": ...}
cpu_util is process CPU time / wall time per timed decode: close to the thread
count when the machine is quiet, lower when other work steals the cores.

Example:
    python3 bench/llamacpp_prefill.py --model smollm2-135m-f32.gguf \\
        --tokens 512,2048,4096 --threads 2 --reps 3
"""

import argparse
import json
import os
import statistics
import time

import numpy as np

import llama_cpp
from llama_cpp import Llama


def make_ids(llm, n, text_file, seed):
    if text_file:
        with open(text_file, "rb") as f:
            ids = llm.tokenize(f.read(), add_bos=False, special=False)
        if len(ids) < n:
            ids = (ids * (n // max(len(ids), 1) + 1))
        return ids[:n]
    rng = np.random.default_rng(seed)
    lo = 1000  # skip special / control tokens at the start of the vocab
    return [int(x) for x in rng.integers(lo, llm.n_vocab(), size=n)]


def bench_one(model, n, threads, reps, warmup, text_file, seed):
    llm = Llama(
        model_path=model,
        n_ctx=n + 16,
        n_batch=n,
        n_ubatch=n,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        flash_attn=False,
        n_gpu_layers=0,
        verbose=False,
    )
    ids = make_ids(llm, n, text_file, seed)
    ctx = llm._ctx
    batch = llm._batch
    batch.set_batch(batch=ids, n_past=0, logits_all=False)  # logits for last token only
    times = []
    cpu_util = []  # process CPU seconds / wall seconds; ~threads when not contended
    for r in range(warmup + reps):
        ctx.kv_cache_clear()  # fresh KV cache every repetition
        c0 = time.process_time()
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(ctx.ctx, batch.batch)
        llama_cpp.llama_synchronize(ctx.ctx)
        dt = time.perf_counter() - t0
        dc = time.process_time() - c0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        if r >= warmup:
            times.append(dt)
            cpu_util.append(dc / dt)
    del llm
    best = min(times)
    med = statistics.median(times)
    v = llama_cpp.__version__
    return {
        "engine": "llama.cpp",
        "reference": f"llama-cpp-python {v}",
        "model": os.path.basename(model),
        "tokens": n,
        "threads": threads,
        "reps": reps,
        "times_s": [round(t, 4) for t in times],
        "best_s": round(best, 4),
        "median_s": round(med, 4),
        "tok_per_s_best": round(n / best, 1),
        "tok_per_s_median": round(n / med, 1),
        "cpu_util": [round(u, 2) for u in cpu_util],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main():
    ap = argparse.ArgumentParser(description="llama.cpp prefill speed anchor (not run by CI)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", default="512,2048,4096")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed decodes before timing")
    ap.add_argument("--text-file", default=None, help="tokenize this file instead of random ids")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    for n in [int(x) for x in args.tokens.split(",") if x]:
        res = bench_one(args.model, n, args.threads, args.reps, args.warmup,
                        args.text_file, args.seed)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
