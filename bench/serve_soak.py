#!/usr/bin/env python3
"""A soak test of `lazyprefill serve` under hostile traffic, bounded in time (issue 54, item 7).

Starts the server (a small K/V budget, so admission is exercised), then for --seconds runs
--workers client threads, each drawing its next action at random: a valid completion (prompt of
1-200 words, max_tokens 1-24, a random pruning override), a streamed chat read to [DONE], a
malformed body (not JSON, wrong types, max_tokens past the context, an unknown field type, a bad
override), a stream cancelled mid-way (the socket closed after the first chunk), a slow reader (a
stream read a few bytes at a time with pauses), an idle connection held open past the header
timeout, and raw garbage bytes. Every 5 s it samples the server's resident memory
(/proc/PID/status) and its gauges (/metrics).

It fails (exit 1, the reasons printed) on: any 5xx; a valid request not answered 200; a malformed
one not answered 4xx; reserved K/V ever above the budget; a request the server accepted and
neither finished nor saw cancelled (its log against the clients' count); resident memory after
warm-up growing by more than --rss-growth (default 10%) between the first and the last third of
the run. A JSON summary goes to stdout.

    bench/serve_soak.py --lazyprefill build/lazyprefill [--seconds 600] [--workers 8] [--model PATH]

Python's standard library only. Under AddressSanitizer: pass the sanitizer build's binary
(build-asan/lazyprefill); ASan's own reports end the server with a non-zero status, which fails
the run.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WORDS = "in the beginning god created the heaven and the earth and the earth was without form".split()


def start(exe, model, log, budget_mib):
    args = [exe, "serve", "--port", "0", "--kv-budget-mib", str(budget_mib), "--log-requests", log,
            "--max-connections", "64", "--header-timeout-s", "2", "--body-timeout-s", "2", "--threads", "2"]
    if model:
        args += ["--model", model]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    # The first line says where the port answers 503 while the model loads; this one, that it serves.
    seen, m = [], None
    for line in proc.stderr:
        seen.append(line)
        m = re.search(r" on http://[^:]+:(\d+) ", line)
        if m or len(seen) > 20:
            break
    if not m:
        sys.exit(f"serve_soak: the server did not say where it serves: {''.join(seen)!r}")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # drain
    return proc, int(m.group(1))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.problems = []
        self.accepted = 0  # requests the server answered 200 or started streaming
        self.cancelled = 0  # of those, streams the client closed before the end

    def add(self, what, n=1):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def accept(self, cancelled=False):
        with self.lock:
            self.accepted += 1
            self.cancelled += int(cancelled)

    def problem(self, msg):
        with self.lock:
            if len(self.problems) < 50:
                self.problems.append(msg)


def post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


def prompt(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 200)))


def override(rng):
    return rng.choice([{}, {"lazyprefill": {"prune": "lazyllm"}}, {"lazyprefill": {"prune": "none"}},
                       {"lazyprefill": {"prune": "random-drop", "seed": rng.randint(0, 9)}}])


def valid(port, rng, st):
    status, out = post(port, "/v1/completions",
                       {"prompt": prompt(rng), "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.7]),
                        **override(rng)})
    st.add(f"valid {status}")
    if status == 200:
        st.accept()
    else:
        st.problem(f"a valid completion got {status}: {out[:200]!r}")


def stream(port, rng, st, cancel=False, slow=False):
    body = {"messages": [{"role": "user", "content": prompt(rng)}], "max_tokens": rng.randint(2, 24),
            "stream": True, **override(rng)}
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
    got = b""
    try:
        while True:
            chunk = s.recv(7 if slow else 65536)
            if not chunk:
                break
            got += chunk
            if slow:
                time.sleep(0.02)
            if cancel and b"data: " in got:
                st.accept(cancelled=True)
                st.add("cancelled stream")
                return
    finally:
        s.close()
    head = got.split(b"\r\n", 1)[0]
    if not head.startswith(b"HTTP/1.1 200"):
        st.problem(f"a stream got {head!r}")
        st.add("stream bad")
        return
    st.accept()
    ok = b"data: [DONE]" in got and b'"error"' not in got
    st.add("slow stream" if slow else "stream", 1)
    if not ok:
        st.problem(f"a stream did not end in [DONE] without error: {got[-200:]!r}")


MALFORMED = [
    b"{not json", b"[]", b'{"prompt": 5}', b'{"prompt": "x", "max_tokens": -1}', b'{"prompt": "x", "max_tokens": 1e400}',
    b'{"prompt": "x", "max_tokens": 100000000}', b'{"prompt": "x", "temperature": "hot"}',
    b'{"prompt": "x", "lazyprefill": {"prune": "lazyllm", "schedule": "2:0.5,1:0.5"}}',
    b'{"messages": [{"role": "wizard", "content": 3}]}', b'{"prompt": "\\ud800"}', b"\xff\xfe\x00",
    b'{"prompt": "x", "n": 3}', b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}',
]


def malformed(port, rng, st):
    path = rng.choice(["/v1/completions", "/v1/chat/completions"])
    status, out = post(port, path, rng.choice(MALFORMED))
    st.add(f"malformed {status}")
    if not 400 <= status < 500:
        st.problem(f"a malformed body got {status}: {out[:200]!r}")


def idle(port, rng, st):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    time.sleep(rng.uniform(0.5, 3.0))  # past the 2 s header timeout, sometimes
    s.close()
    st.add("idle")


def garbage(port, rng, st):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))) + b"\r\n\r\n")
    try:
        head = s.recv(64)
    except OSError:
        head = b""
    s.close()
    st.add("garbage")
    if head and not (head.startswith(b"HTTP/1.1 4") or head.startswith(b"HTTP/1.0 4")):
        st.problem(f"garbage got {head!r}")


ACTIONS = [(valid, 30), (lambda p, r, s: stream(p, r, s), 15), (malformed, 20),
           (lambda p, r, s: stream(p, r, s, cancel=True), 10), (lambda p, r, s: stream(p, r, s, slow=True), 5),
           (idle, 5), (garbage, 15)]


def worker(port, seed, until, st):
    rng = random.Random(seed)
    fns, weights = zip(*ACTIONS)
    while time.time() < until:
        fn = rng.choices(fns, weights)[0]
        try:
            fn(port, rng, st)
        except (OSError, http.client.HTTPException) as e:
            st.problem(f"{getattr(fn, '__name__', 'stream')}: {type(e).__name__}: {e}")


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    vals = {}
    for line in text.splitlines():
        if line.startswith("lazyprefill_") and " " in line:
            name, v = line.rsplit(" ", 1)
            vals[name] = float(v)
    return vals


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--lazyprefill", default="build/lazyprefill")
    ap.add_argument("--model", default="")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--kv-budget-mib", type=int, default=16)  # two or three requests at once: admission waits
    ap.add_argument("--rss-growth", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "requests.jsonl")
        proc, port = start(a.lazyprefill, a.model, log, a.kv_budget_mib)
        st = Stats()
        t0 = time.time()
        until = t0 + a.seconds
        threads = [threading.Thread(target=worker, args=(port, a.seed * 1000 + i, until, st)) for i in range(a.workers)]
        for t in threads:
            t.start()
        samples = []  # (t, rss KiB, reserved, budget)
        while time.time() < until:
            time.sleep(min(5, max(0.0, until - time.time())))
            try:
                m = metrics(port)
                samples.append((time.time() - t0, rss_kib(proc.pid), m.get("lazyprefill_kv_cache_bytes_reserved", 0),
                                m.get("lazyprefill_kv_cache_budget_bytes", 0)))
            except (OSError, http.client.HTTPException) as e:
                st.problem(f"/metrics: {e}")
            if proc.poll() is not None:
                st.problem(f"the server exited with {proc.returncode} during the run")
                break
        for t in threads:
            t.join()
        time.sleep(1)  # the last cancellations reach the engine
        final = metrics(port) if proc.poll() is None else {}
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
        if rc != 0:
            st.problem(f"the server exited {rc} after SIGTERM")
        with open(log, encoding="utf-8") as f:
            lines = [json.loads(l) for l in f]
    finished = sum(1 for l in lines if l["finish"] in ("length", "stop"))
    cancelled = sum(1 for l in lines if l["finish"] == "cancelled")
    errors = sum(1 for l in lines if l["finish"] == "error")
    if errors:
        st.problem(f"{errors} requests ended in an engine error")
    # Every request a client saw accepted is in the log, finished or cancelled (a cancelled stream
    # may have finished before the server saw the client leave).
    if len(lines) != st.accepted:
        st.problem(f"{len(lines)} log lines for {st.accepted} accepted requests")
    over = [s for s in samples if s[3] > 0 and s[2] > s[3]]
    if over:
        st.problem(f"reserved K/V above the budget at {len(over)} samples, e.g. {over[0]}")
    rss = [s[1] for s in samples if s[0] > min(60, a.seconds / 3)]
    growth = 0.0
    if len(rss) >= 6:
        third = len(rss) // 3
        first, last = statistics.median(rss[:third]), statistics.median(rss[-third:])
        growth = last / first - 1
        if growth > a.rss_growth:
            st.problem(f"resident memory grew {100 * growth:.1f}% after warm-up ({first} -> {last} KiB)")
    fives = {k: v for k, v in st.counts.items() if re.search(r" 5\d\d$", k)}
    if fives:
        st.problem(f"5xx answers: {fives}")
    summary = {"seconds": a.seconds, "workers": a.workers, "actions": st.counts, "accepted": st.accepted,
               "log_lines": len(lines), "finished": finished, "cancelled_in_log": cancelled,
               "cancelled_by_clients": st.cancelled, "rss_kib_first_last": [rss[0], rss[-1]] if rss else [],
               "rss_growth_after_warmup": round(growth, 4), "kv_reserved_peak": max((s[2] for s in samples), default=0),
               "kv_budget": samples[-1][3] if samples else 0,
               "server_requests_total": {k: v for k, v in final.items() if k.startswith("lazyprefill_requests_total")},
               "problems": st.problems}
    print(json.dumps(summary, indent=1))
    return 1 if st.problems else 0


if __name__ == "__main__":
    sys.exit(main())
