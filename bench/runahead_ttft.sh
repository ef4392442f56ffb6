#!/usr/bin/env bash
# KV-Runahead on this machine: TTFT of one process on 1 and on 2 threads against `mpirun -n 2 run
# --runahead` with the balanced and the even partition, one thread per rank, alternated within
# each round (this VM's speed drifts). OPTIONAL MEASUREMENT SCRIPT, NOT RUN BY CI.
#
#   bench/runahead_ttft.sh [ROUNDS] [CHARS...]     (default 3 rounds; 8740 17040 31600 characters
#                                                   of KJV text: about 2k, 4k and 7.7k tokens)
#
# Prints one line per round and prompt: the prompt's tokens, then each TTFT in ms (and for the
# ranks, their chunks and waits). docs/runahead.md has the medians of a run.
#
# KEEP=DIR keeps every run's --json output there (compacted: `jq -c`), as `validate --runahead`
# reads them: single-t1-TOKENS-rROUND.json and single-t2-... (one process on 1 and 2 threads, with
# per-op timings), runahead-balanced-... and runahead-even-... (the last rank's output), plus, for
# the calibration's row range, one-thread runs of the CALIB sizes (default 2200 4400 characters:
# about 512 and 1k tokens). RUNAHEAD_HW=FILE partitions by that profile instead of cpu-local.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
sizes=("$@")
((${#sizes[@]})) || sizes=(8740 17040 31600)
home=${LAZYPREFILL_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/lazyprefill}
kjv="$home/text/kjv.txt"
[ -f "$kjv" ] || { echo "runahead_ttft: $kjv missing (scripts/setup makes it)" >&2; exit 1; }
[ -x build/lazyprefill ] || { echo "runahead_ttft: build/lazyprefill missing (scripts/setup builds it)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in "${sizes[@]}"; do  # the verses' text joined, its first n characters
  python3 -c 'import sys; t = " ".join(l.split("\t", 1)[-1].rstrip("\n") for l in open(sys.argv[1])); open(sys.argv[3], "w").write(t[:int(sys.argv[2])])' \
      "$kjv" "$n" "$tmp/p$n.txt"
done
keep=${KEEP:-}
calib=(${CALIB:-2200 4400})
hwopt=()
[ -n "${RUNAHEAD_HW:-}" ] && hwopt=(--runahead-hw "$RUNAHEAD_HW")
[ -n "$keep" ] && mkdir -p "$keep"
for n in "${calib[@]}"; do
  python3 -c 'import sys; t = " ".join(l.split("\t", 1)[-1].rstrip("\n") for l in open(sys.argv[1])); open(sys.argv[3], "w").write(t[:int(sys.argv[2])])' \
      "$kjv" "$n" "$tmp/c$n.txt"
done
# save NAME: stdin to $keep/NAME (compacted) and to stdout
save() { if [ -n "$keep" ]; then jq -c . | tee "$keep/$1"; else cat; fi; }
ttft() { python3 -c "import json,sys; print(round(json.load(sys.stdin)['ttft_ms']))"; }
ranks() {
  python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['ttft_ms']), '+'.join(map(str, d['partition'])), 'waits', ','.join('%.0f' % r['wait_ms'] for r in d['ranks_detail']))"
}
for round in $(seq "$rounds"); do
  if [ -n "$keep" ]; then
    for n in "${calib[@]}"; do
      f="$tmp/c$n.txt"
      tokens=$(build/lazyprefill run --prompt-file "$f" --max-new-tokens 0 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['prompt_tokens'])")
      one=$(build/lazyprefill run --prompt-file "$f" --max-new-tokens 1 --threads 1 --json | save "single-t1-$tokens-r$round.json" | ttft)
      echo "round $round, $tokens tokens (calibration): 1 thread $one"
    done
  fi
  for n in "${sizes[@]}"; do
    f="$tmp/p$n.txt"
    tokens=$(build/lazyprefill run --prompt-file "$f" --max-new-tokens 0 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['prompt_tokens'])")
    one=$(build/lazyprefill run --prompt-file "$f" --max-new-tokens 1 --threads 1 --json | save "single-t1-$tokens-r$round.json" | ttft)
    two=$(build/lazyprefill run --prompt-file "$f" --max-new-tokens 1 --threads 2 --json | save "single-t2-$tokens-r$round.json" | ttft)
    bal=$(mpirun -n 2 --oversubscribe build/lazyprefill run --runahead "${hwopt[@]}" --prompt-file "$f" --max-new-tokens 1 --threads 1 --json | save "runahead-balanced-$tokens-r$round.json" | ranks)
    even=$(mpirun -n 2 --oversubscribe build/lazyprefill run --runahead --partition even --prompt-file "$f" --max-new-tokens 1 --threads 1 --json | save "runahead-even-$tokens-r$round.json" | ranks)
    echo "round $round, $tokens tokens: 1 thread $one | 2 threads $two | runahead balanced $bal | even $even"
  done
done
