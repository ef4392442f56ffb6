#!/usr/bin/env python3
"""Alone, then batched: the same greedy completions against a running `lazyprefill serve`.

Sends N prompts (slices of a text file) one at a time, then all N at once, with temperature 0
and ignore_eos, and checks that each prompt's text is the same both ways (the continuous
batching's promise, docs/serving.md). Prints the generated tokens per second of each way and
their ratio. Standard library only, so it runs where no venv can be made (the lent GPU machine).

  python3 bench/serve_batch_check.py --url http://127.0.0.1:8089 --text kjv.txt --n 8
Exit status: 0 when every text matched, 1 when one differed, 2 on a bad argument or a failed
request.
"""
import argparse
import concurrent.futures
import json
import sys
import time
import urllib.request


def post(url, body, timeout):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8089")
    p.add_argument("--text", required=True, help="plain text the prompts are cut from")
    p.add_argument("--n", type=int, default=8, help="prompts (and the batch's width)")
    p.add_argument("--prompt-chars", type=int, default=2000, help="characters a prompt")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prune", default=None, help="per-request override (none, lazyllm, ...)")
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args()
    if a.n < 1 or a.prompt_chars < 1 or a.max_tokens < 1:
        print("serve_batch_check: --n, --prompt-chars and --max-tokens must be positive", file=sys.stderr)
        return 2
    try:
        with open(a.text, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        print(f"serve_batch_check: {a.text}: {e.strerror}", file=sys.stderr)
        return 2
    if len(text) < a.n * a.prompt_chars:
        print(f"serve_batch_check: {a.text}: too short for {a.n} prompts of {a.prompt_chars} characters",
              file=sys.stderr)
        return 2
    step = len(text) // a.n
    bodies = []
    for i in range(a.n):
        body = {"prompt": text[i * step:i * step + a.prompt_chars], "max_tokens": a.max_tokens,
                "temperature": 0, "ignore_eos": True}
        if a.prune:
            body["lazyprefill"] = {"prune": a.prune}
        bodies.append(body)

    for _ in range(600):  # the server may still be loading the model
        try:
            with urllib.request.urlopen(a.url + "/health", timeout=2):
                break
        except OSError:
            time.sleep(0.5)
    else:
        print(f"serve_batch_check: {a.url}/health never answered", file=sys.stderr)
        return 2

    try:
        t0 = time.perf_counter()
        alone = [post(a.url, b, a.timeout) for b in bodies]
        t_alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(a.n) as ex:
            batched = list(ex.map(lambda b: post(a.url, b, a.timeout), bodies))
        t_batched = time.perf_counter() - t0
    except (OSError, ValueError) as e:
        print(f"serve_batch_check: a request failed: {e}", file=sys.stderr)
        return 2

    tokens = sum(r["usage"]["completion_tokens"] for r in alone)
    prompt_tokens = [r["usage"]["prompt_tokens"] for r in alone]
    differ = [i for i in range(a.n) if alone[i]["choices"][0]["text"] != batched[i]["choices"][0]["text"]]
    print(f"{a.n} prompts of {min(prompt_tokens)}-{max(prompt_tokens)} tokens, {a.max_tokens} generated each"
          f" (prune {a.prune or 'server default'})")
    print(f"  one at a time: {t_alone:.2f} s, {tokens / t_alone:.1f} generated tokens/s")
    print(f"  all at once:   {t_batched:.2f} s, {tokens / t_batched:.1f} generated tokens/s"
          f" ({t_alone / t_batched:.2f}x)")
    if differ:
        for i in differ:
            print(f"  prompt {i}: alone {alone[i]['choices'][0]['text']!r}\n"
                  f"           batched {batched[i]['choices'][0]['text']!r}")
        print(f"FAIL: {len(differ)} of {a.n} texts differ alone and batched")
        return 1
    print(f"OK: all {a.n} texts are the same alone and batched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
