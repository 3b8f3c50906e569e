#!/usr/bin/env bash
# A/B of two data-plane binaries on the plain path: CPU per small non-streaming request, plain
# engines, kept-alive connections, runs interleaved (A B A B ...) so machine load hits both alike.
#
#   bench/plain-ab.sh A_BINARY B_BINARY [ROUNDS]     # ROUNDS A+B pairs, default 4
#
# Set-up as in bench/tls.sh's `plain` mode: four engine simulators (no latency model, one thread,
# from $ILB, default target/release/ilb) and wrk share CPU 0; the data plane under test runs alone
# on CPU 1 with one worker thread, started fresh for every run. Each run: a 2 s warm-up, then a
# measured wrk run of DURATION seconds; the data plane's user+system CPU time over the measured run
# (from /proc/PID/stat) is divided by the requests wrk completed. Prints one line per run and a
# summary (mean, min, max, sample standard deviation) per binary, and the load average at the
# start and end. Everything stays on 127.0.0.1; every process started here is stopped by its PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
A=${1:?usage: bench/plain-ab.sh A_BINARY B_BINARY [ROUNDS]}
B=${2:?usage: bench/plain-ab.sh A_BINARY B_BINARY [ROUNDS]}
ROUNDS=${3:-4}
ILB=${ILB:-target/release/ilb}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
LUA=${LUA:-$(pwd)/bench/chat.lua}
for b in "$A" "$B" "$ILB"; do [ -x "$b" ] || { echo "not an executable: $b"; exit 1; }; done
command -v wrk >/dev/null || { echo "wrk is missing (apt-get install wrk)"; exit 1; }

pids=()
dp=
cleanup() { for p in "${pids[@]}" $dp; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tick_hz=$(getconf CLK_TCK)

wait_http() { # url
  for _ in $(seq 1 100); do
    if curl -s -o /dev/null -m 1 "$1"; then return 0; fi
    sleep 0.1
  done
  echo "no answer from $1"; exit 1
}

taskset -c 0 "$ILB" --log warn engine-sim --listen 127.0.0.1:19620 --count 4 --model mock-model --no-latency --threads 1 >/dev/null &
pids+=($!)
wait_http http://127.0.0.1:19620/health
engines=()
for i in 0 1 2 3; do engines+=(--engine "http://127.0.0.1:$((19620 + i))"); done

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
results=$(mktemp)
run_one() { # label binary round
  local label=$1 bin=$2 round=$3 port=19691 before after out requests errors
  taskset -c 1 "$bin" --log warn data-plane --threads 1 --listen "127.0.0.1:$port" "${engines[@]}" >/dev/null &
  dp=$!
  wait_http "http://127.0.0.1:$port/health"
  local url="http://127.0.0.1:$port/v1/chat/completions"
  sleep 1 # discovery of the engines' models
  taskset -c 0 wrk -t1 -c"$CONNS" -d2s -s "$LUA" "$url" >/dev/null
  before=$(cpu_ticks "$dp")
  out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$LUA" "$url")
  after=$(cpu_ticks "$dp")
  requests=$(echo "$out" | sed -n 's/^JSON .*"requests":\([0-9]*\).*/\1/p')
  errors=$(echo "$out" | sed -n 's/^JSON .*"errors_status":\([0-9]*\).*/\1/p')
  kill "$dp"; wait "$dp" 2>/dev/null || true
  dp=
  awk -v l="$label" -v r="$round" -v t=$((after - before)) -v n="$requests" -v hz="$tick_hz" -v e="$errors" -v d="$DURATION" \
    -v la="$(cut -d' ' -f1 /proc/loadavg)" \
    'BEGIN { us = t / hz * 1e6 / n; printf "%s round %d: %8d requests (%6.0f/s, %s bad status), data plane CPU %6.2f us/request, load %s\n", l, r, n, n / d, e, us, la; printf "%s %.4f\n", l, us > "/dev/stderr" }' \
    2>>"$results"
}
for r in $(seq 1 "$ROUNDS"); do
  run_one A "$A" "$r"
  run_one B "$B" "$r"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "A = $A"
echo "B = $B"
awk '{ n[$1]++; s[$1] += $2; q[$1] += $2 * $2; if (!($1 in lo) || $2 < lo[$1]) lo[$1] = $2; if ($2 > hi[$1]) hi[$1] = $2 }
  END { for (k in n) { m = s[k] / n[k]; sd = n[k] > 1 ? sqrt((q[k] - n[k] * m * m) / (n[k] - 1)) : 0;
    printf "%s: %d runs, mean %.2f us/request, min %.2f, max %.2f, sd %.2f\n", k, n[k], m, lo[k], hi[k], sd }
    if (("A" in n) && ("B" in n)) printf "A / B = %.3f\n", (s["A"] / n["A"]) / (s["B"] / n["B"]) }' "$results" | sort
rm -f "$results"
