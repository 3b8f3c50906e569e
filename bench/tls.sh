#!/usr/bin/env bash
# CPU per small non-streaming request through the data plane, plain vs TLS, on loopback.
#
#   cargo build --release -p ilb
#   cargo run --release -p ilb-tls --features test-certs --example gen_certs -- /tmp/ilb-bench-certs
#   bench/tls.sh [RUNS]          # RUNS rounds of every mode, default 3
#
# Four engine simulators (no latency model, one thread) and wrk share CPU 0; the data plane runs
# alone on CPU 1 with one worker thread. For each mode the data plane's user+system CPU time
# (from /proc/PID/stat, over the measured run only, after a warm-up) is divided by the requests
# wrk completed. Modes:
#   plain        http client listener, http engines (kept-alive connections)
#   tls-engines  http client listener, https engines (kept-alive, one handshake per connection)
#   tls-both     https client listener (wrk over TLS) and https engines
#   close-plain  plain, and every client request on a new connection (Connection: close)
#   close-tls    tls-both, every client request on a new TLS connection: the difference to
#                close-plain is the data plane's server-side handshake cost
# After each mode's last run the data plane's RSS is read; the idle engine connections it then
# holds are in its pool (one per concurrent request, CONNS), so (RSS tls - RSS plain) / CONNS
# estimates the extra memory per idle TLS connection (client side buffers included).
# Everything stays on 127.0.0.1; every process started here is stopped by its PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUNS=${1:-3}
ILB=${ILB:-target/release/ilb}
CERTS=${CERTS:-/tmp/ilb-bench-certs}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
LUA=${LUA:-$(pwd)/bench/chat.lua}
[ -x "$ILB" ] || { echo "build first: cargo build --release -p ilb"; exit 1; }
[ -f "$CERTS/ca.pem" ] || { echo "make certificates first (see the header of $0)"; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing (apt-get install wrk)"; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
tick_hz=$(getconf CLK_TCK)

wait_http() { # url [curl args]
  local url=$1; shift
  for _ in $(seq 1 100); do
    if curl -s -o /dev/null -m 1 "$@" "$url"; then return 0; fi
    sleep 0.1
  done
  echo "no answer from $url"; exit 1
}

start_engines() { # first-port tls(0/1)
  local args=(--log warn engine-sim --listen "127.0.0.1:$1" --count 4 --model mock-model --no-latency --threads 1)
  [ "$2" = 1 ] && args+=(--tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key")
  taskset -c 0 "$ILB" "${args[@]}" >/dev/null &
  pids+=($!)
}

# Engines: plain on 19600-19603, TLS on 19610-19613.
start_engines 19600 0
start_engines 19610 1
wait_http http://127.0.0.1:19600/health
wait_http https://127.0.0.1:19610/health --cacert "$CERTS/ca.pem"

run_mode() { # mode
  local mode=$1 scheme=http engines=() dp_args=() wrk_args=() port=19690
  local eng_scheme=http eng_port=19600
  case $mode in
    tls-engines) eng_scheme=https eng_port=19610 ;;
    tls-both|close-tls) eng_scheme=https eng_port=19610; scheme=https ;;
  esac
  for i in 0 1 2 3; do engines+=(--engine "$eng_scheme://127.0.0.1:$((eng_port + i))"); done
  [ "$eng_scheme" = https ] && dp_args+=(--engine-ca "$CERTS/ca.pem" --engine-ca-only)
  [ "$scheme" = https ] && dp_args+=(--tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key")
  case $mode in close-*) wrk_args+=(-H "Connection: close") ;; esac
  taskset -c 1 "$ILB" --log warn,rustls=error data-plane --threads 1 --listen "127.0.0.1:$port" "${engines[@]}" "${dp_args[@]}" >/dev/null &
  local dp=$!
  pids+=($dp)
  wait_http "$scheme://127.0.0.1:$port/health" --cacert "$CERTS/ca.pem"
  local url="$scheme://127.0.0.1:$port/v1/chat/completions"
  sleep 1 # discovery of the engines' models
  taskset -c 0 wrk -t1 -c"$CONNS" -d2s -s "$LUA" "${wrk_args[@]}" "$url" >/dev/null
  for r in $(seq 1 "$RUNS"); do
    local before after out requests
    before=$(cpu_ticks "$dp")
    out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$LUA" "${wrk_args[@]}" "$url")
    after=$(cpu_ticks "$dp")
    requests=$(echo "$out" | sed -n 's/^JSON .*"requests":\([0-9]*\).*/\1/p')
    errors=$(echo "$out" | sed -n 's/^JSON .*"errors_status":\([0-9]*\).*/\1/p')
    awk -v m="$mode" -v r="$r" -v t=$((after - before)) -v n="$requests" -v hz="$tick_hz" -v e="$errors" -v d="$DURATION" \
      'BEGIN { printf "%-12s run %d: %8d requests (%6.0f/s, %s bad status), data plane CPU %6.2f us/request\n", m, r, n, n / d, e, t / hz * 1e6 / n }'
  done
  echo "$mode: data plane RSS after the runs $(rss_kb "$dp") kB"
  kill "$dp"; wait "$dp" 2>/dev/null || true
}

for mode in plain tls-engines tls-both close-plain close-tls; do run_mode "$mode"; done
