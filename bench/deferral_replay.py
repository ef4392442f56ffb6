#!/usr/bin/env python3
"""How often LazyLLM's decoding steps would defer their selections on a GPU (issue 58, item 2), from a
trace of the same run (`lazyprefill run --prune lazyllm --trace FILE`, any backend: the revivals are
the engine's, not the backend's).

A step defers its selections (one wait, for its logits) after `defer_after` steps in a row that revived
nothing; a deferred step that would have revived is undone and computed again, and defer_after doubles
(up to 64). This replays engine/session.cpp's rule (Session::settle) over the trace's revivals, and the
rule without the doubling for comparison; a step computed again costs a whole step, a deferred one
saves its pruning layers' waits.

  python3 bench/deferral_replay.py run.jsonl
"""
import argparse
import json


def replay(revived, double, cap=64):
    clean, after, once, again = 0, 1, 0, 0
    for r in revived:
        if clean >= after:
            if r > 0:
                again += 1
                if double:
                    after = min(2 * after, cap)
            else:
                once += 1
        clean = clean + 1 if r == 0 else 0
    return once, again


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a trace file (JSON Lines) of a LazyLLM run with decoding steps")
    a = ap.parse_args()
    steps = []
    with open(a.trace, encoding="utf-8") as f:
        header = json.loads(f.readline())
        for line in f:
            s = json.loads(line)
            if s.get("kind") == "decode":
                steps.append(sum(s["revived"]))
    if not steps:
        raise SystemExit(f"{a.trace}: no decoding steps")
    n = len(steps)
    with_revivals = sum(1 for r in steps if r > 0)
    last = max((i for i, r in enumerate(steps) if r > 0), default=None)
    print(f"{header.get('model', {}).get('name', '?')}, {header.get('prompt_tokens')} prompt tokens, "
          f"schedule {header.get('schedule')}: {n} decoding steps, {with_revivals} revive "
          f"(the last at step {last})")
    for name, double in (("Session's rule (doubling)", True), ("after one clean step, always", False)):
        once, again = replay(steps, double)
        print(f"  {name:<30} {once:4d} steps wait once ({once / n:.0%}), "
              f"{again:4d} computed again ({again / n:.1%})")


if __name__ == "__main__":
    main()
