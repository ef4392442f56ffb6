#!/usr/bin/env python3
"""Load test of `lazyprefill serve` with an independent load generator: guidellm 0.8.1 (PyPI).

OPTIONAL MEASUREMENT SCRIPT, NOT RUN BY CI. For each pruning method (--prune) it starts its own
server (`build/lazyprefill serve --port 0 --prune METHOD ...`), waits for GET /health, sends one
preflight request shaped like guidellm's (so an API mismatch is reported with the server's own
message), then runs guidellm once with a poisson profile at every rate of --rates (each rate a
sub-benchmark of one scenario file, --requests requests or --duration seconds each), scrapes
/metrics, stops the server with SIGTERM (exit 0 expected) and records its peak RSS (VmHWM from
/proc/PID/status, sampled every 0.1 s until exit). Prints one table per method and
writes everything to --out; guidellm's own JSON report and everything else lies next to it:

  OUT.json                      this script's summary (tables, config, per-rate numbers)
  OUT.prompts.jsonl             the prompts (guidellm json_file data, shared by every method)
  OUT.METHOD.scenario.json      the guidellm scenario (guidellm run -c FILE; its target is that run's port)
  OUT.METHOD.guidellm.json      guidellm's raw report
  OUT.METHOD.guidellm.log       guidellm's console output
  OUT.METHOD.server.log         the server's stderr
  OUT.METHOD.requests.jsonl     the server's --log-requests file (one JSON line per request)
  OUT.METHOD.metrics.txt        GET /metrics (Prometheus text) just before SIGTERM

The prompts: --prompts passages of consecutive verses of the KJV text in the cache (text/kjv.txt,
"Book C:V<TAB>text"), each a different passage, cut to a length drawn uniformly from
--prompt-tokens (seeded) and measured with the model's own tokenizer (made from the GGUF file);
each row also gives output_tokens_count = --output-tokens, which guidellm sends as max_tokens (with
ignore_eos, which the server honours, so every request generates exactly that many tokens; the
generated-token counts are reported). Every rate replays the same prompts from the first.
Requests go to /v1/completions (the raw passage, so the prompt length is exact), streamed,
greedy (temperature 0; --temperature).

Python: the first run makes a venv in ${LAZYPREFILL_HOME:-~/.cache/lazyprefill}/guidellm-venv
with pip (guidellm==0.8.1, gguf pinned; guidellm pulls torch: several GB) unless --venv names one
that has them; this script then runs itself with that venv's python. The tokenizer guidellm is
given is written once from the GGUF into the cache (guidellm-tokenizer/MODEL/). Nothing is fetched
from the Hugging Face hub (HF_HUB_OFFLINE=1).

Examples:
  # the full comparison: 4 rates x 16 requests, 1-4k-token prompts, 32 output tokens
  bench/serve_load.py --prune none,lazyllm --rates 0.1,0.2,0.4,0.8 --requests 16 \\
      --prompt-tokens 1024:4096 --output-tokens 32 --out build/serve_load/run.json
  # a smoke run (a minute or two per method)
  bench/serve_load.py --prune none,lazyllm --rates 0.5,1 --requests 3 --prompt-tokens 200:400 \\
      --output-tokens 8 --out build/serve_load/smoke.json
  # a fixed duration per rate, server options passed through, an existing venv
  bench/serve_load.py --rates 0.2,0.4 --duration 120 --kv-budget-mib 512 --max-batch-tokens 4096 \\
      --venv /tmp/gvenv

Exits non-zero with one line saying why on the first failure (a server that does not start or
exits non-zero, a preflight refused, a guidellm error or errored requests).
"""

import argparse
import json
import math
import os
import queue
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

GUIDELLM_VERSION = "0.8.1"
GGUF_VERSION = "0.19.0"  # the gguf package, for transformers' GGUF tokenizer reader
DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PCTS = ("p50", "p90", "p99")


class Failure(Exception):
    """One line saying what went wrong; main() prints it and exits 1."""


def say(msg):
    print(f"[serve_load] {msg}", file=sys.stderr, flush=True)


def lp_home():
    return os.environ.get("LAZYPREFILL_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lazyprefill")


def csv_floats(s):
    try:
        v = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {s!r}")
    if not v or any(not (x > 0) for x in v):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {s!r}")
    return v


def token_range(s):
    m = re.fullmatch(r"\s*(\d+)\s*(?:[:-]\s*(\d+)\s*)?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX or N, got {s!r}")
    lo = int(m.group(1))
    hi = int(m.group(2) or lo)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {s!r}")
    return lo, hi


def tokens_groups(s):
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", s)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"expected TOKENS:GROUPS, whole numbers from 1, got {s!r}")
    return int(m.group(1)), int(m.group(2))


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Load test of `lazyprefill serve` with guidellm " + GUIDELLM_VERSION,
        epilog=__doc__[__doc__.index("Examples:"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("load")
    g.add_argument("--prune", default="none,lazyllm",
                   help="methods, one server each: none, lazyllm, static, random (default none,lazyllm)")
    g.add_argument("--rates", type=csv_floats, default=[0.1, 0.2, 0.4, 0.8],
                   help="poisson rates in requests/s, one guidellm sub-benchmark each (default 0.1,0.2,0.4,0.8)")
    g.add_argument("--requests", type=int, default=None,
                   help="requests per rate (guidellm max_requests; default 16 unless --duration)")
    g.add_argument("--duration", type=float, default=None,
                   help="seconds per rate (guidellm max_duration; requests still open then are cancelled)")
    g.add_argument("--prompts", type=int, default=None,
                   help="distinct prompts (default --requests, or 64 with --duration only); every rate "
                        "starts again from the first, and guidellm cycles through them")
    g.add_argument("--prompt-tokens", type=token_range, default=(1024, 4096), metavar="MIN:MAX",
                   help="prompt lengths in tokens, uniform (default 1024:4096)")
    g.add_argument("--output-tokens", type=int, default=32, help="max_tokens of every request (default 32)")
    g.add_argument("--shared-prefix", type=tokens_groups, default=None, metavar="TOKENS:GROUPS",
                   help="prompt i starts with document i mod GROUPS, a passage of TOKENS tokens of its own, "
                        "then its own passage of --prompt-tokens (many questions over a few documents: the "
                        "server's prefix cache; its request log says what each prompt found cached)")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    g.add_argument("--seed", type=int, default=0, help="seeds prompt lengths and guidellm's arrivals (default 0)")
    g.add_argument("--request-timeout", type=float, default=900,
                   help="seconds guidellm waits for a response (default 900)")
    g.add_argument("--guidellm-workers", type=int, default=1,
                   help="guidellm worker processes (default 1: one asyncio process carries these rates, "
                        "and every extra one competes with the server for the CPU)")
    g.add_argument("--allow-errors", action="store_true",
                   help="report errored requests instead of failing on them")
    s = ap.add_argument_group("server (passed through to `lazyprefill serve`)")
    s.add_argument("--cli", default=os.path.join(ROOT, "build", "lazyprefill"), help="the lazyprefill binary")
    s.add_argument("--model", default=os.path.join(lp_home(), "models", DEFAULT_MODEL), help="GGUF file")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--kv-budget-mib", type=int)
    s.add_argument("--max-batch-tokens", type=int)
    s.add_argument("--schedule", help="pruning schedule (inline or a JSON file)")
    s.add_argument("--dtype", choices=["auto", "f32", "bf16", "int8"])
    s.add_argument("--log-requests", metavar="FILE",
                   help="the server's request log; '{prune}' in the name is replaced by the method "
                        "(default OUT.{prune}.requests.jsonl)")
    s.add_argument("--server-args", default="", metavar="'ARGS'",
                   help="more server options, one shell-quoted string: --server-args='--dtype f32'")
    s.add_argument("--start-timeout", type=float, default=180, help="seconds to wait for the server to listen")
    s.add_argument("--stop-timeout", type=float, default=60, help="seconds to wait for exit after SIGTERM")
    o = ap.add_argument_group("files")
    o.add_argument("--out", default=os.path.join(ROOT, "build", "serve_load", "serve_load.json"),
                   help="summary JSON; the raw files go next to it (default build/serve_load/serve_load.json)")
    o.add_argument("--venv", help="use this venv (it must hold guidellm==%s and gguf); default: "
                                  "$LAZYPREFILL_HOME/guidellm-venv, made with pip if missing" % GUIDELLM_VERSION)
    o.add_argument("--kjv", default=os.path.join(lp_home(), "text", "kjv.txt"), help="verse-per-line text")
    a = ap.parse_args(argv)

    a.prune = [p.strip() for p in a.prune.split(",") if p.strip()]
    known = ("none", "lazyllm", "static-paper", "random-drop", "frozen", "random-layers")
    bad = [p for p in a.prune if p not in known]
    if not a.prune or bad:
        ap.error(f"--prune: unknown method(s) {bad or a.prune} ({', '.join(known)})")
    if len(set(a.prune)) != len(a.prune):
        ap.error("--prune: a method is named twice")
    if a.requests is None and a.duration is None:
        a.requests = 16
    if a.requests is not None and a.requests < 1:
        ap.error("--requests must be at least 1")
    if a.duration is not None and not a.duration > 0:
        ap.error("--duration must be positive")
    if a.prompts is None:
        a.prompts = a.requests if a.requests is not None else 64
    if a.prompts < 1 or a.output_tokens < 1 or a.guidellm_workers < 1 or a.threads < 1:
        ap.error("--prompts, --output-tokens, --guidellm-workers and --threads must be at least 1")
    if not 0 <= a.temperature <= 2:
        ap.error("--temperature must be in [0, 2]")
    a.out = os.path.abspath(a.out)
    a.cli = os.path.abspath(a.cli)
    a.model = os.path.abspath(os.path.expanduser(a.model))
    a.kjv = os.path.abspath(os.path.expanduser(a.kjv))
    a.venv_given = a.venv is not None
    a.venv = os.path.abspath(os.path.expanduser(a.venv or os.path.join(lp_home(), "guidellm-venv")))
    return a


# ---------------------------------------------------------------------------------------------
# 1. The venv, and running inside it.

def venv_versions(venv):
    """(guidellm, gguf) versions installed in `venv`, None for each one missing."""
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None, None
    code = ("import importlib.metadata as m\n"
            "def v(n):\n"
            "    try: return m.version(n)\n"
            "    except m.PackageNotFoundError: return ''\n"
            "print(v('guidellm')); print(v('gguf'))")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None
    lines = (r.stdout.splitlines() + ["", ""])[:2]
    return lines[0] or None, lines[1] or None


def ensure_venv(a, default_venv):
    have = venv_versions(a.venv)
    if have == (GUIDELLM_VERSION, GGUF_VERSION):
        return
    if have[0] == GUIDELLM_VERSION and have[1] is not None and not default_venv:
        say(f"note: {a.venv} has gguf {have[1]}, not the pinned {GGUF_VERSION}")
        return
    if not default_venv:
        raise Failure(f"--venv {a.venv} holds guidellm {have[0] or 'nothing'} and gguf {have[1] or 'nothing'}; "
                      f"it needs guidellm=={GUIDELLM_VERSION} and gguf (pinned {GGUF_VERSION})")
    py = os.path.join(a.venv, "bin", "python")
    if not os.access(py, os.X_OK):
        say(f"creating {a.venv}")
        r = subprocess.run([sys.executable, "-m", "venv", a.venv])
        if r.returncode != 0:
            raise Failure(f"python3 -m venv {a.venv} failed (exit {r.returncode}); is python3-venv installed?")
    say(f"installing guidellm=={GUIDELLM_VERSION} gguf=={GGUF_VERSION} into {a.venv} (torch included: "
        f"several GB, minutes)")
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        f"guidellm=={GUIDELLM_VERSION}", f"gguf=={GGUF_VERSION}"])
    if r.returncode != 0:
        raise Failure(f"pip install guidellm=={GUIDELLM_VERSION} gguf=={GGUF_VERSION} into {a.venv} failed "
                      f"(exit {r.returncode})")
    if venv_versions(a.venv) != (GUIDELLM_VERSION, GGUF_VERSION):
        raise Failure(f"{a.venv} still does not hold guidellm=={GUIDELLM_VERSION} gguf=={GGUF_VERSION}")


def in_venv(venv):
    return os.path.realpath(sys.prefix) == os.path.realpath(venv)


def offline_env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false",
               HF_HOME=os.path.join(lp_home(), "guidellm-hf"))
    return env


# ---------------------------------------------------------------------------------------------
# 2. The tokenizer (from the GGUF) and the prompts.

def ensure_tokenizer(model):
    """A Hugging Face tokenizer folder made from the GGUF file, cached; returns (path, tokenizer)."""
    from transformers import AutoTokenizer  # the venv's

    st = os.stat(model)
    stamp = {"gguf": model, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    name = os.path.basename(model)
    out = os.path.join(lp_home(), "guidellm-tokenizer", name[:-5] if name.endswith(".gguf") else name)
    stamp_file = os.path.join(out, "lazyprefill-source.json")
    try:
        with open(stamp_file) as f:
            fresh = json.load(f) == stamp and os.path.isfile(os.path.join(out, "tokenizer.json"))
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        say(f"writing the tokenizer of {name} to {out}")
        try:
            tok = AutoTokenizer.from_pretrained(os.path.dirname(model), gguf_file=name)
        except Exception as e:  # noqa: BLE001 - one line for whatever transformers raises
            raise Failure(f"cannot read a tokenizer from {model}: {type(e).__name__}: {e}")
        tmp = out + ".part"
        subprocess.run(["rm", "-rf", tmp], check=True)
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "lazyprefill-source.json"), "w") as f:
            json.dump(stamp, f)
        subprocess.run(["rm", "-rf", out], check=True)
        os.replace(tmp, out)
    return out, AutoTokenizer.from_pretrained(out)


def make_prompts(a, tok, path):
    """Writes the guidellm data file; returns the rows' token counts and passages."""
    verses = []
    try:
        with open(a.kjv, encoding="utf-8") as f:
            for line in f:
                ref, sep, text = line.rstrip("\n").partition("\t")
                if sep and text.strip():
                    verses.append((ref, " ".join(text.split())))
    except OSError as e:
        raise Failure(f"cannot read the KJV text {a.kjv}: {e.strerror} (scripts/setup writes it)")
    if not verses:
        raise Failure(f"{a.kjv} holds no 'Book C:V<TAB>text' lines")
    counts = [len(ids) for ids in tok([" " + t for _, t in verses], add_special_tokens=False)["input_ids"]]

    rng = random.Random(a.seed)
    lo, hi = a.prompt_tokens
    rows, v = [], 0
    docs = []  # --shared-prefix: (text, passage) of each document, cut to TOKENS tokens
    if a.shared_prefix:
        doc_tokens, groups = a.shared_prefix
        for g in range(groups):
            first, have = v, 0
            while have < doc_tokens + 8:
                if v >= len(verses):
                    raise Failure(f"the KJV text is too short for {groups} documents of {doc_tokens} tokens")
                have += counts[v]
                v += 1
            ids = tok(" ".join(t for _, t in verses[first:v]), add_special_tokens=False)["input_ids"][:doc_tokens]
            docs.append((tok.decode(ids), f"{verses[first][0]} - {verses[v - 1][0]}"))
    for i in range(a.prompts):
        want = rng.randint(lo, hi)
        first, have = v, 0
        while have < want + 8:  # whole verses, a few tokens beyond, then cut to `want` tokens
            if v >= len(verses):
                raise Failure(f"the KJV text ({len(verses)} verses, {sum(counts)} tokens) is too short for "
                              f"{a.prompts} distinct passages of {lo}-{hi} tokens; ask for fewer --prompts")
            have += counts[v]
            v += 1
        text = " ".join(t for _, t in verses[first:v])
        ids = tok(text, add_special_tokens=False)["input_ids"][:want]
        prompt = tok.decode(ids)
        passage = f"{verses[first][0]} - {verses[v - 1][0]}"
        if docs:
            doc, doc_passage = docs[i % len(docs)]
            prompt = doc + "\n\n" + prompt
            passage = f"document {i % len(docs)} ({doc_passage}), then {passage}"
        n = len(tok(prompt, add_special_tokens=False)["input_ids"])
        rows.append({"prompt": prompt, "prompt_tokens_count": n, "output_tokens_count": a.output_tokens,
                     "passage": passage, "target_tokens": want})
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return rows


# ---------------------------------------------------------------------------------------------
# 3. The server.

class Server:
    LISTEN = re.compile(r"lazyprefill serve: .* on http://(\S+):(\d+) ")

    def __init__(self, cmd, log_path):
        self.cmd = cmd
        self.log_path = log_path
        self.lines = queue.Queue()
        self.peak_hwm_kib = 0
        self.peak_rss_sampled_kib = 0
        self.samples = 0
        self.exit_code = None
        self.started_wall = None
        self.log = open(log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.PIPE,
                                     text=True, errors="replace")
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            self.lines.put(line)
        self.lines.put(None)

    def _sample(self):
        path = f"/proc/{self.proc.pid}/status"
        while True:
            try:
                with open(path) as f:
                    status = f.read()
            except OSError:
                return
            hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
            rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
            if not hwm:  # a zombie: it has exited, nothing more to read
                return
            self.peak_hwm_kib = max(self.peak_hwm_kib, int(hwm.group(1)))
            if rss:
                self.peak_rss_sampled_kib = max(self.peak_rss_sampled_kib, int(rss.group(1)))
            self.samples += 1
            time.sleep(0.1)

    def tail(self, n=6):
        self.log.flush()
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return " | ".join(l.strip() for l in f.readlines()[-n:] if l.strip()) or "(it said nothing)"
        except OSError:
            return "(no log)"

    def wait_listening(self, timeout):
        """Returns (host, port) from the server's first lines."""
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                self.kill()
                raise Failure(f"the server did not say where it listens within {timeout:.0f} s: {self.tail()}")
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                code = self.reap(10)
                raise Failure(f"the server exited (code {code}) before listening: {self.tail()}")
            m = self.LISTEN.search(line)
            if m:
                self.started_wall = time.time()
                return m.group(1).strip("[]"), int(m.group(2))

    def reap(self, timeout):
        """Waits for exit; returns the exit code, None on timeout. (Not the child's ru_maxrss: Linux
        carries the forking process's peak into it across exec, and this one holds a tokenizer.)"""
        deadline = time.time() + timeout
        while True:
            pid, status = os.waitpid(self.proc.pid, os.WNOHANG)
            if pid == self.proc.pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.exit_code
                self.sampler.join(1)
                self.log.flush()
                return self.exit_code
            if time.time() >= deadline:
                return None
            time.sleep(0.05)

    def stop(self, timeout):
        self.proc.send_signal(signal.SIGTERM)
        code = self.reap(timeout)
        if code is None:
            self.kill()
            raise Failure(f"the server did not exit within {timeout:.0f} s of SIGTERM (killed): {self.tail()}")
        return code

    def kill(self):
        if self.exit_code is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.reap(10)


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def wait_health(base, server, timeout):
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        if server.proc.poll() is not None:
            raise Failure(f"the server exited (code {server.proc.returncode}) before /health answered: "
                          f"{server.tail()}")
        try:
            status, body = http_get(base + "/health", 5)
            if status == 200:
                return
            last = f"HTTP {status} {body[:200]}"
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.2)
    raise Failure(f"GET {base}/health did not answer 200 within {timeout:.0f} s ({last})")


def preflight(base, model_name, a):
    """One request shaped exactly like guidellm's (/v1/completions, stream, stream_options with
    continuous_usage_stats, max_tokens, ignore_eos, temperature): the server's own error if it is
    refused; checks the SSE stream gives text, a usage chunk and [DONE]."""
    body = {"model": model_name, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_tokens": 2, "ignore_eos": True, "temperature": a.temperature,
            "prompt": "In the beginning God created the heaven and the earth."}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        try:
            err = json.loads(detail)["error"]
            detail = f"{err.get('message')} (param {err.get('param')!r}, code {err.get('code')!r})"
        except (ValueError, KeyError, TypeError):
            pass
        raise Failure(f"the server refused a guidellm-shaped request: HTTP {e.code}: {detail}; body sent: "
                      f"{json.dumps(body)}")
    except (urllib.error.URLError, OSError) as e:
        raise Failure(f"POST {base}/v1/completions failed: {e}")
    events = [l[5:].strip() for l in raw.splitlines() if l.startswith("data:")]
    if not events or events[-1] != "[DONE]":
        raise Failure(f"the completion stream did not end with 'data: [DONE]': {raw[-300:]!r}")
    chunks = [json.loads(e) for e in events[:-1]]
    if not any(c.get("choices") and c["choices"][0].get("text") for c in chunks):
        raise Failure(f"the completion stream held no text chunk: {raw[-300:]!r}")
    if not any(c.get("usage") for c in chunks):
        raise Failure("the completion stream held no usage chunk (stream_options.include_usage); guidellm would "
                      "count one token per chunk instead")
    return chunks


# ---------------------------------------------------------------------------------------------
# 4. guidellm, and its report.

def scenario(a, method, target, model_name, tokenizer_dir, prompts_path, raw_path):
    constraints = []
    if a.requests is not None:
        constraints.append({"kind": "max_requests", "count": a.requests})
    if a.duration is not None:
        constraints.append({"kind": "max_duration", "seconds": a.duration})
    return {
        "metadata": {"labels": {"driver": "bench/serve_load.py", "prune": method,
                                "model": os.path.basename(a.model)}},
        "spec": {
            "backend": {
                "kind": "openai_http", "target": target, "model": model_name,
                "request_format": "/v1/completions",
                "http2": False,  # the server speaks HTTP/1.1
                "timeout": a.request_timeout,
                "extras": {"body": {"temperature": a.temperature}},
            },
            "profile": {"kind": "poisson", "rate": a.rates[0]},
            "constraints": constraints,
            "tokenizer": {"kind": "huggingface_auto", "model": tokenizer_dir},
            "data": [{"kind": "json_file", "path": prompts_path}],
            "seed": {"kind": "static", "value": a.seed},
            "outputs": [{"kind": "json", "path": raw_path}],
        },
        "benchmarks": [{"profile.rate": r} for r in a.rates],
    }


def run_guidellm(a, scen_path, log_path, cwd):
    guidellm = os.path.join(a.venv, "bin", "guidellm")
    cmd = [guidellm, "run", "-c", scen_path, "--disable-console-interactive"]
    env = offline_env()
    env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(a.guidellm_workers)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    t0 = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if r.returncode != 0:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [l.strip() for l in f if l.strip()]
        why = next((l for l in reversed(lines) if re.match(r"(Error|\w+(Error|Exception))\b", l)), lines[-1])
        raise Failure(f"guidellm exited {r.returncode}: {why} (see {log_path})")
    return cmd, time.time() - t0


def dist(d, *keys):
    """The percentiles and mean of a guidellm StatusDistributionSummary's group."""
    for k in keys:
        d = (d or {}).get(k)
    if not d or not d.get("count"):
        return None
    p = d.get("percentiles") or {}
    out = {k: p.get(k) for k in PCTS}
    out["mean"] = d.get("mean")
    out["count"] = d.get("count")
    return out


def pct(values, q):
    """Nearest-rank percentile, as guidellm reports them for small samples."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def read_request_log(path, offset):
    recs = []
    try:
        with open(path, encoding="utf-8") as f:
            f.seek(offset)
            for line in f:
                if line.strip():
                    recs.append(json.loads(line))
    except OSError:
        pass
    return recs


def summarize(raw_path, server, server_recs, prompt_counts):
    with open(raw_path, encoding="utf-8") as f:
        report = json.load(f)
    rates = []
    benches = report.get("benchmarks") or []
    # The server logs times in seconds since it started, which is when it printed where it listens.
    for rec in server_recs:
        rec["_arrival_wall"] = server.started_wall + rec["arrival_s"]
    windows = []
    for b in benches:
        reqs = b.get("requests") or {}
        starts = [r.get("request_start_time") for g in ("successful", "errored", "incomplete")
                  for r in reqs.get(g) or [] if r.get("request_start_time")]
        sm = b.get("scheduler_metrics") or {}
        lo = min(starts + [sm.get("request_start_time") or math.inf])
        hi = max(starts + [sm.get("request_end_time") or -math.inf])
        windows.append((lo - 0.5, hi + 0.5))
    for i, b in enumerate(benches):
        m = b["metrics"]
        reqs = b.get("requests") or {}
        ok = reqs.get("successful") or []
        totals = m["request_totals"]
        lo, hi = windows[i]
        srv = [r for r in server_recs if lo <= r["_arrival_wall"] <= hi]
        out_tokens = [r.get("output_tokens") for r in ok if r.get("output_tokens") is not None]
        mismatch = []
        for r in ok:
            try:
                prompt = json.loads(r["request_args"])["body"]["prompt"]
            except (KeyError, TypeError, ValueError):
                continue
            if prompt in prompt_counts and r.get("prompt_tokens") is not None:
                mismatch.append(r["prompt_tokens"] - prompt_counts[prompt])
        errors = [((r.get("info") or {}).get("error") or "?") for r in reqs.get("errored") or []]
        finishes = {}
        for r in srv:
            finishes[r.get("finish")] = finishes.get(r.get("finish"), 0) + 1
        comp = [r["prompt_tokens_computed_fraction"] for r in srv if "prompt_tokens_computed_fraction" in r]
        rates.append({
            "rate": b["config"]["strategy"].get("rate"),
            "requests": {k: totals.get(k) for k in ("successful", "errored", "incomplete", "total")},
            "duration_s": b.get("duration"),
            "req_per_s": (m["requests_per_second"]["successful"] or {}).get("mean"),
            "output_tok_per_s": (m["output_tokens_per_second"]["total"] or {}).get("mean"),
            "ttft_ms": dist(m, "time_to_first_token_ms", "successful"),
            "itl_ms": dist(m, "inter_token_latency_ms", "successful"),
            "request_latency_s": dist(m, "request_latency", "successful"),
            "request_concurrency": dist(m, "request_concurrency", "successful"),
            # how late guidellm sent requests against its poisson schedule (a loaded client shows here)
            "send_delay_ms_mean": 1e3 * ((b.get("scheduler_metrics") or {}).get("request_targeted_start_delay_avg")
                                         or 0),
            "output_tokens": {"min": min(out_tokens), "mean": statistics.fmean(out_tokens),
                              "max": max(out_tokens), "total": sum(out_tokens)} if out_tokens else None,
            "prompt_tokens": dist(m, "prompt_token_count", "successful"),
            "prompt_tokens_server_minus_ours": {"min": min(mismatch), "max": max(mismatch)} if mismatch else None,
            "errors": errors[:5],
            "server": {
                "requests_logged": len(srv),
                "finish": finishes,
                "output_tokens_total": sum(r.get("output_tokens", 0) for r in srv),
                "queue_ms_p50": 1e3 * pct([r["queue_s"] for r in srv], 50) if srv else None,
                "ttft_ms_p50": 1e3 * pct([r["ttft_s"] for r in srv], 50) if srv else None,
                "ttft_ms_p90": 1e3 * pct([r["ttft_s"] for r in srv], 90) if srv else None,
                "prompt_tokens_computed_fraction_mean": statistics.fmean(comp) if comp else None,
                "revivals_total": sum(r.get("revivals", 0) for r in srv),
            },
        })
    return report, rates


def fmt(v, spec=".0f"):
    return "-" if v is None else format(v, spec)


def print_table(method, res):
    srv = res["server"]
    print(f"\n== prune {method}: server peak RSS {fmt(srv['peak_rss_mib'], '.1f')} MiB (VmHWM), exit "
          f"{srv['exit_code']}; guidellm {fmt(res['guidellm']['wall_s'], '.0f')} s")
    head = ("rate/s", "done", "req/s", "out tok/s", "out tok/req", "TTFT p50", "p90", "p99",
            "ITL p50", "p90", "p99", "EOS")
    rows = []
    for r in res["rates"]:
        q = r["requests"]
        t, i, o = r["ttft_ms"] or {}, r["itl_ms"] or {}, r["output_tokens"] or {}
        done = f"{q['successful']}/{q['total']}" + (f" ({q['errored']} err)" if q["errored"] else "")
        rows.append((fmt(r["rate"], "g"), done, fmt(r["req_per_s"], ".3f"), fmt(r["output_tok_per_s"], ".1f"),
                     fmt(o.get("mean"), ".1f"), fmt(t.get("p50")), fmt(t.get("p90")), fmt(t.get("p99")),
                     fmt(i.get("p50"), ".1f"), fmt(i.get("p90"), ".1f"), fmt(i.get("p99"), ".1f"),
                     str(r["server"]["finish"].get("stop", 0))))
    widths = [max(len(h), *(len(x[k]) for x in rows)) for k, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for x in rows:
        print("  ".join(c.rjust(w) for c, w in zip(x, widths)))
    print("(TTFT, ITL in ms from guidellm, completed requests; ITL is each request's mean, weighted by its "
          "tokens; EOS: requests the server ended at end of generation before max_tokens)")


# ---------------------------------------------------------------------------------------------

def run_method(a, method, paths, tokenizer_dir, prompts_path, prompt_counts, max_prompt):
    stem = paths["stem"]
    log_requests = paths["log_requests"](method)
    os.makedirs(os.path.dirname(log_requests) or ".", exist_ok=True)
    offset = os.path.getsize(log_requests) if os.path.exists(log_requests) else 0
    cmd = [a.cli, "serve", "--port", "0", "--model", a.model, "--prune", method, "--threads", str(a.threads),
           "--log-requests", log_requests]
    for opt, val in (("--kv-budget-mib", a.kv_budget_mib), ("--max-batch-tokens", a.max_batch_tokens),
                     ("--schedule", a.schedule), ("--dtype", a.dtype)):
        if val is not None:
            cmd += [opt, str(val)]
    cmd += shlex.split(a.server_args)
    say(f"prune {method}: starting " + " ".join(shlex.quote(c) for c in cmd))
    server = Server(cmd, f"{stem}.{method}.server.log")
    try:
        host, port = server.wait_listening(a.start_timeout)
        base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        wait_health(base, server, 60)
        _, models = http_get(base + "/v1/models")
        data = json.loads(models)["data"][0]
        model_name, max_len = data["id"], data.get("max_model_len")
        if max_len and max_prompt + a.output_tokens > max_len:
            raise Failure(f"prompts of up to {max_prompt} tokens plus {a.output_tokens} to generate exceed the "
                          f"model's context of {max_len}")
        preflight(base, model_name, a)
        scen = scenario(a, method, base, model_name, tokenizer_dir, prompts_path, f"{stem}.{method}.guidellm.json")
        scen_path = f"{stem}.{method}.scenario.json"
        with open(scen_path, "w") as f:
            json.dump(scen, f, indent=2)
        say(f"prune {method}: guidellm at {','.join(f'{r:g}' for r in a.rates)} req/s on {base} "
            f"(log {stem}.{method}.guidellm.log)")
        gcmd, wall = run_guidellm(a, scen_path, f"{stem}.{method}.guidellm.log", os.path.dirname(stem))
        try:
            _, metrics = http_get(base + "/metrics")
            with open(f"{stem}.{method}.metrics.txt", "w") as f:
                f.write(metrics)
        except (urllib.error.URLError, OSError) as e:
            say(f"note: GET /metrics failed: {e}")
        code = server.stop(a.stop_timeout)
        if code != 0:
            raise Failure(f"the server exited {code} after SIGTERM (expected 0): {server.tail()}")
    except BaseException:
        server.kill()
        raise
    recs = read_request_log(log_requests, offset)
    raw_path = f"{stem}.{method}.guidellm.json"
    if not os.path.exists(raw_path):
        raise Failure(f"guidellm wrote no report at {raw_path}")
    _, rates = summarize(raw_path, server, recs, prompt_counts)
    if len(rates) != len(a.rates):
        raise Failure(f"guidellm reported {len(rates)} benchmark(s) for {len(a.rates)} rate(s); see {raw_path}")
    errored = sum(r["requests"]["errored"] or 0 for r in rates)
    if errored and not a.allow_errors:
        first = next(e for r in rates for e in r["errors"])
        raise Failure(f"prune {method}: {errored} request(s) errored; the first: {first} (--allow-errors to "
                      f"report them instead)")
    if not any(r["requests"]["successful"] for r in rates):
        raise Failure(f"prune {method}: no request completed; see {raw_path}")
    mib = lambda kib: None if not kib else kib / 1024  # noqa: E731
    return {
        "prune": method,
        "server": {"cmd": cmd, "exit_code": server.exit_code, "model_name": model_name, "max_model_len": max_len,
                   "peak_rss_mib": mib(server.peak_hwm_kib), "peak_rss_sampled_mib": mib(server.peak_rss_sampled_kib),
                   "rss_samples": server.samples,
                   "log": server.log_path, "request_log": log_requests, "request_log_lines": len(recs),
                   "metrics": f"{stem}.{method}.metrics.txt"},
        "guidellm": {"cmd": gcmd, "scenario": scen_path, "raw": raw_path, "log": f"{stem}.{method}.guidellm.log",
                     "wall_s": wall},
        "rates": rates,
    }


def main(argv):
    a = parse_args(argv)
    if not in_venv(a.venv):
        ensure_venv(a, not a.venv_given)
        py = os.path.join(a.venv, "bin", "python")
        os.execve(py, [py, os.path.abspath(__file__)] + argv, offline_env())

    import importlib.metadata as md
    if md.version("guidellm") != GUIDELLM_VERSION:
        raise Failure(f"{a.venv} holds guidellm {md.version('guidellm')}, not {GUIDELLM_VERSION}")
    for path, what in ((a.cli, "the lazyprefill binary (build it: scripts/setup)"), (a.model, "the model")):
        if not os.path.isfile(path):
            raise Failure(f"{path} does not exist: {what}")
    stem = a.out[:-5] if a.out.endswith(".json") else a.out
    os.makedirs(os.path.dirname(stem), exist_ok=True)

    def log_requests(method):
        if a.log_requests is None:
            return f"{stem}.{method}.requests.jsonl"
        p = os.path.abspath(a.log_requests)
        if "{prune}" in p:
            return p.replace("{prune}", method)
        if len(a.prune) == 1:
            return p
        root, ext = os.path.splitext(p)
        return f"{root}.{method}{ext}"

    tokenizer_dir, tok = ensure_tokenizer(a.model)
    prompts_path = f"{stem}.prompts.jsonl"
    rows = make_prompts(a, tok, prompts_path)
    lengths = [r["prompt_tokens_count"] for r in rows]
    say(f"{len(rows)} prompts of {min(lengths)}-{max(lengths)} tokens (mean {statistics.fmean(lengths):.0f}) "
        f"from {rows[0]['passage']} on, in {prompts_path}")
    prompt_counts = {r["prompt"]: r["prompt_tokens_count"] for r in rows}

    results = {
        "driver": "bench/serve_load.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": argv,
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()},
        "guidellm": {"version": GUIDELLM_VERSION, "venv": a.venv, "tokenizer": tokenizer_dir},
        "load": {"rates": a.rates, "profile": "poisson", "requests_per_rate": a.requests,
                 "duration_per_rate_s": a.duration, "output_tokens": a.output_tokens, "temperature": a.temperature,
                 "seed": a.seed, "endpoint": "/v1/completions", "stream": True,
                 "shared_prefix": list(a.shared_prefix) if a.shared_prefix else None},
        "prompts": {"file": prompts_path, "count": len(rows), "range_asked": list(a.prompt_tokens),
                    "tokens": {"min": min(lengths), "mean": statistics.fmean(lengths), "max": max(lengths)},
                    "source": a.kjv},
        "methods": [],
    }
    for method in a.prune:
        res = run_method(a, method, {"stem": stem, "log_requests": log_requests}, tokenizer_dir, prompts_path,
                         prompt_counts, max(lengths))
        results["methods"].append(res)
        with open(a.out, "w") as f:
            json.dump(results, f, indent=2)
        for r in res["rates"]:
            d = r["prompt_tokens_server_minus_ours"]
            if d and (d["min"] or d["max"]):
                say(f"note: prune {method} rate {r['rate']:g}: the server counted the prompts "
                    f"{d['min']:+d}..{d['max']:+d} tokens off the tokenizer's count")
    for res in results["methods"]:
        print_table(res["prune"], res)
    print(f"\nsummary: {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Failure as e:
        print(f"serve_load: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("serve_load: error: interrupted", file=sys.stderr)
        sys.exit(130)
