#!/usr/bin/env bash
# Slow token streams, as real LLM answers arrive, through the data plane and its peers: router CPU
# per stream and per chunk, per-chunk latency added, time to first chunk, RSS.
#
#   ../shared/bench/peers/setup.sh                                   # once: the peers, wrk
#   cargo build --release -p ilb && cargo build --release -p ilb-dataplane --example stream_load
#   bench/streams.sh                                                 # both sections, ~5 minutes
#
# Section `streams`: four mock engines (`stream_load serve`: every content chunk after a pause
# drawn uniformly from SPACING_MS, vLLM's chunk shapes, each chunk stamped with the time it was
# sent) and the load client (`stream_load load`: STREAMS kept-alive connections started over
# RAMP_MS, each running ROUNDS streams of CHUNKS chunks, with `include_usage`) share CPU 0; each
# router runs alone on CPU 1, started fresh: direct (no router), ilb, ilb-tls (ilb with TLS on
# both sides: https engines with a throwaway CA, an https listener, the client over TLS),
# vllm-router, sglang-router (SMG) and Envoy 1.40 (the kit's envoy-candidate.sh, one worker);
# optionally l4-floor: HAProxy 2.6 relaying TCP (`mode tcp`, one thread, round robin; apt-get
# install haproxy), which parses nothing and forwards each chunk as it comes: the floor of any
# proxy that does not hold chunks back, on this machine. The router's user+system CPU
# (from /proc, over the whole load run) is divided by the streams and by the content chunks
# served; the per-chunk latency is the time from the engine's write to the client's read, so
# "added" is a router's figure less direct's of the same run.
#
# Section `kit`: the peer kit's run.sh (`nonstream`, `delay`, `stream-ttft`) with ilb as the
# candidate beside sglang-router and vllm-router, then (`nonstream`, `delay`) with Envoy as the
# candidate beside vllm-router; each run's ratios are to vllm-router of the same run.
#
# Knobs: SECTIONS ("streams kit"), CONTENDERS ("direct ilb ilb-tls vllm-router sglang-router envoy"),
# STREAMS (1000), CHUNKS (256), SPACING_MS (20-50), RAMP_MS (2000), ROUNDS (1), KIT_DUR (5),
# KIT_WARM (1), ILB (target/release/ilb), ILB_ARGS (extra data-plane flags), LOADGEN
# (target/release/examples/stream_load), PEERS_KIT (../shared/bench/peers), PEERS_HOME
# (/tmp/ilb-peers), OUT (target/bench-streams/<time>). Everything stays on 127.0.0.1; every
# process started here is stopped by its recorded PID (the kit's lib.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd)
PEERS_KIT=${PEERS_KIT:-$REPO/../shared/bench/peers}
# shellcheck source=/dev/null
source "$PEERS_KIT/lib.sh"
RUN_DIR=$PEERS_HOME/run-streams # PID records of this script, apart from run.sh's

SECTIONS=${SECTIONS:-"streams kit"}
CONTENDERS=${CONTENDERS:-"direct ilb ilb-tls vllm-router sglang-router envoy"}
STREAMS=${STREAMS:-1000}
CHUNKS=${CHUNKS:-256}
SPACING_MS=${SPACING_MS:-20-50}
RAMP_MS=${RAMP_MS:-2000}
ROUNDS=${ROUNDS:-1}
KIT_DUR=${KIT_DUR:-5}
KIT_WARM=${KIT_WARM:-1}
ILB=$(realpath -m "${ILB:-target/release/ilb}")
ILB_ARGS=${ILB_ARGS:-}
LOADGEN=$(realpath -m "${LOADGEN:-target/release/examples/stream_load}")
OUT=$(realpath -m "${OUT:-target/bench-streams/$(date +%Y%m%d-%H%M%S)}")
ENGINE_PORTS=(19801 19802 19803 19804)
TLS_ENGINE_PORTS=(19811 19812 19813 19814)
ROUTER_PORT=19890
METRICS_PORT=19891
PY=python3

die() { echo "streams.sh: $*" >&2; exit 1; }
[ -x "$ILB" ] || die "no data plane at $ILB: cargo build --release -p ilb"
[ -x "$LOADGEN" ] || die "no load tool at $LOADGEN: cargo build --release -p ilb-dataplane --example stream_load"
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs (router on CPU 1, load on CPU 0)"
ulimit -n "$(ulimit -Hn)" # a router holds two sockets per stream
mkdir -p "$OUT"
RESULTS=$OUT/streams.jsonl
LOAD=(taskset -c 0)
ROUTER=(taskset -c 1)

TLS_DIR=$OUT/tls # the https engines' throwaway CA and certificate

stop_stale
cleanup() { stop load; stop router; stop engines; stop tlsengines; }
trap cleanup EXIT
trap 'exit 130' INT TERM

chat='{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
http_ok() { # URL: a non-streamed chat completion answers 200
  [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 -H 'Content-Type: application/json' \
      --cacert "$TLS_DIR/ca.pem" -d "$chat" "$1/v1/chat/completions" 2>/dev/null)" = 200 ]
}
engine_urls=()
for p in "${ENGINE_PORTS[@]}"; do engine_urls+=("http://127.0.0.1:$p"); done
tls_engine_urls=()
for p in "${TLS_ENGINE_PORTS[@]}"; do tls_engine_urls+=("https://127.0.0.1:$p"); done

# start_router NAME: the contender on ROUTER_PORT, alone on CPU 1; sets CUR_PID (empty: direct)
start_router() {
  local name=$1 log=$OUT/router-$1.log csv flags=()
  CUR_PID=
  csv=$(IFS=,; echo "${engine_urls[*]}")
  for u in "${engine_urls[@]}"; do flags+=(--engine "$u"); done
  case $name in
    direct) return 0 ;;
    ilb)
      # shellcheck disable=SC2086
      start router "$log" "${ROUTER[@]}" "$ILB" --log warn data-plane --listen "127.0.0.1:$ROUTER_PORT" "${flags[@]}" $ILB_ARGS ;;
    ilb-tls)
      flags=()
      for u in "${tls_engine_urls[@]}"; do flags+=(--engine "$u"); done
      # shellcheck disable=SC2086
      start router "$log" "${ROUTER[@]}" "$ILB" --log warn,rustls=error data-plane --listen "127.0.0.1:$ROUTER_PORT" \
        "${flags[@]}" --engine-ca "$TLS_DIR/ca.pem" --tls-cert "$TLS_DIR/server.pem" --tls-key "$TLS_DIR/server.key" $ILB_ARGS ;;
    vllm-router)
      start router "$log" "${ROUTER[@]}" "$VENV/bin/vllm-router" --host 127.0.0.1 --port "$ROUTER_PORT" \
        --worker-urls "${engine_urls[@]}" --policy round_robin \
        --prometheus-host 127.0.0.1 --prometheus-port "$METRICS_PORT" ;;
    sglang-router)
      start router "$log" "${ROUTER[@]}" "$VENV/bin/smg" launch --host 127.0.0.1 --port "$ROUTER_PORT" \
        --worker-urls "${engine_urls[@]}" --policy round_robin --log-level warn \
        --prometheus-host 127.0.0.1 --prometheus-port "$METRICS_PORT" ;;
    envoy)
      start router "$log" "${ROUTER[@]}" "$PEERS_KIT/envoy-candidate.sh" "$ROUTER_PORT" "$csv" ;;
    l4-floor)
      command -v haproxy >/dev/null || { echo "l4-floor needs haproxy (apt-get install haproxy)" >&2; return 1; }
      {
        printf 'global\n  nbthread 1\n  maxconn 8000\ndefaults\n  mode tcp\n  timeout connect 2s\n'
        printf '  timeout client 600s\n  timeout server 600s\nfrontend f\n  bind 127.0.0.1:%s\n' "$ROUTER_PORT"
        printf '  default_backend engines\nbackend engines\n  balance roundrobin\n'
        for i in "${!ENGINE_PORTS[@]}"; do printf '  server e%s 127.0.0.1:%s\n' "$i" "${ENGINE_PORTS[$i]}"; done
      } >"$OUT/haproxy.cfg"
      start router "$log" "${ROUTER[@]}" haproxy -db -f "$OUT/haproxy.cfg" ;;
    *) die "unknown contender $name" ;;
  esac
  CUR_PID=$(recorded_pid router)
  local base=http://127.0.0.1:$ROUTER_PORT
  [ "$name" = ilb-tls ] && base=https://127.0.0.1:$ROUTER_PORT
  for _ in $(seq 150); do http_ok "$base" && break; sleep 0.2; done
  http_ok "$base" || { tail -n 20 "$log" >&2; return 1; }
  if [ "$name" = vllm-router ] || [ "$name" = sglang-router ]; then
    for _ in $(seq 50); do
      [ "$(curl -s --max-time 2 "$base/workers" | grep -o '"is_healthy":true' | wc -l)" -ge 4 ] && break
      sleep 0.2
    done
  fi
  sleep 0.5
}

# run_streams NAME: one measured load run against the contender, one JSON line into RESULTS
run_streams() {
  local name=$1 urls=() r0=0 r1=0 idle=null rss=null hwm=null la0 la1 log=$OUT/load-$1.txt
  if [ "$name" = direct ]; then
    for u in "${engine_urls[@]}"; do urls+=(--url "$u/v1/chat/completions"); done
  elif [ "$name" = ilb-tls ]; then
    urls=(--url "https://127.0.0.1:$ROUTER_PORT/v1/chat/completions" --ca "$TLS_DIR/ca.pem")
  else
    urls=(--url "http://127.0.0.1:$ROUTER_PORT/v1/chat/completions")
  fi
  if [ -n "$CUR_PID" ]; then idle=$(status_kb_tree "$CUR_PID" VmRSS); r0=$(cpu_ticks_tree "$CUR_PID"); fi
  la0=$(cut -d' ' -f1 /proc/loadavg)
  start load "$log" timeout 600 "${LOAD[@]}" "$LOADGEN" load "${urls[@]}" --streams "$STREAMS" \
    --chunks "$CHUNKS" --rounds "$ROUNDS" --ramp-ms "$RAMP_MS"
  wait "$LAST_PID" 2>/dev/null || true
  rm -f "$RUN_DIR/load.pid"
  la1=$(cut -d' ' -f1 /proc/loadavg)
  if [ -n "$CUR_PID" ]; then
    r1=$(cpu_ticks_tree "$CUR_PID"); rss=$(status_kb_tree "$CUR_PID" VmRSS); hwm=$(status_kb_tree "$CUR_PID" VmHWM)
    [ -n "$(recorded_pid router)" ] || echo "!! $name exited during the run (see $OUT/router-$name.log)" >&2
  fi
  local client; client=$(grep '^{' "$log" | tail -n 1)
  [ -n "$client" ] || { echo "!! no result from the load client for $name (see $log)" >&2; return 0; }
  "$PY" - "$name" "$client" "$([ -n "$CUR_PID" ] && echo $((r1 - r0)) || echo null)" "$idle" "$rss" "$hwm" \
      "$la0" "$la1" "$CHUNKS" >> "$RESULTS" <<'PY'
import json, os, sys
name, client, ticks, idle, rss, hwm, la0, la1, chunks = sys.argv[1:]
d = json.loads(client)
num = lambda x: None if x == "null" else int(x)
mb = lambda kb: None if num(kb) is None else round(num(kb) / 1024, 1)
cpu = None if num(ticks) is None else num(ticks) / os.sysconf("SC_CLK_TCK")
d.update(contender=name, chunks_per_stream=int(chunks), router_cpu_s=cpu,
         cpu_us_per_stream=None if cpu is None or not d["streams_ok"] else round(cpu * 1e6 / d["streams_ok"], 1),
         cpu_us_per_chunk=None if cpu is None or not d["chunks"] else round(cpu * 1e6 / d["chunks"], 2),
         rss_idle_mb=mb(idle), rss_after_mb=mb(rss), rss_peak_mb=mb(hwm), load_start=float(la0), load_end=float(la1))
print(json.dumps(d))
PY
  tail -n 1 "$RESULTS" | "$PY" -c '
import json, sys
d = json.loads(sys.stdin.read()); l = d["chunk_latency_ms"]; t = d["ttft_ms"]
print("  %-14s ok=%d failed=%d chunks=%d cpu/stream=%s us cpu/chunk=%s us chunk p50/p99/p99.9=%s/%s/%s ms ttft p50/p99=%s/%s ms rss idle/peak=%s/%s MB load %.1f-%.1f"
      % (d["contender"], d["streams_ok"], d["streams_failed"], d["chunks"], d["cpu_us_per_stream"], d["cpu_us_per_chunk"],
         l["p50"], l["p99"], l["p999"], t["p50"], t["p99"], d["rss_idle_mb"], d["rss_peak_mb"], d["load_start"], d["load_end"]))'
}

section_streams() {
  : > "$RESULTS"
  local ports; ports=$(IFS=,; echo "${ENGINE_PORTS[*]}")
  start engines "$OUT/engines.log" "${LOAD[@]}" "$LOADGEN" serve --ports "$ports" --spacing-ms "$SPACING_MS"
  for _ in $(seq 50); do http_ok "${engine_urls[0]}" && break; sleep 0.1; done
  http_ok "${engine_urls[0]}" || die "the mock engines did not start (see $OUT/engines.log)"
  if [[ " $CONTENDERS " == *" ilb-tls "* ]]; then
    ports=$(IFS=,; echo "${TLS_ENGINE_PORTS[*]}")
    start tlsengines "$OUT/tls-engines.log" "${LOAD[@]}" "$LOADGEN" serve --ports "$ports" --spacing-ms "$SPACING_MS" --tls-dir "$TLS_DIR"
    for _ in $(seq 50); do http_ok "${tls_engine_urls[0]}" && break; sleep 0.1; done
    http_ok "${tls_engine_urls[0]}" || die "the https mock engines did not start (see $OUT/tls-engines.log)"
  fi
  echo "== streams: $STREAMS streams x $CHUNKS chunks, $SPACING_MS ms apart, ramp $RAMP_MS ms, $ROUNDS round(s) -> $RESULTS"
  for c in $CONTENDERS; do
    if start_router "$c"; then run_streams "$c"; else echo "!! $c did not become ready" >&2; fi
    stop router
  done
  stop engines
  stop tlsengines
  "$PY" - "$RESULTS" <<'PY' | tee "$OUT/streams.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
direct = next((r for r in rows if r["contender"] == "direct"), None)
base = lambda k: direct["chunk_latency_ms"][k] if direct else None
print()
print("| contender | streams ok / failed | CPU µs per stream | CPU µs per chunk | chunk latency p50 / p99 ms | added p99 ms | TTFT p50 / p99 ms | RSS idle / peak MB | load |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    l, t = r["chunk_latency_ms"], r["ttft_ms"]
    added = "-" if r["contender"] == "direct" or direct is None else "%.3f" % (l["p99"] - base("p99"))
    f = lambda v: "-" if v is None else v
    print("| %s | %d / %d | %s | %s | %.3f / %.3f | %s | %.3f / %.3f | %s / %s | %.1f–%.1f |" % (
        r["contender"], r["streams_ok"], r["streams_failed"], f(r["cpu_us_per_stream"]), f(r["cpu_us_per_chunk"]),
        l["p50"], l["p99"], added, t["p50"], t["p99"], f(r["rss_idle_mb"]), f(r["rss_peak_mb"]), r["load_start"], r["load_end"]))
ilb = next((r for r in rows if r["contender"] == "ilb"), None)
if ilb and ilb["cpu_us_per_chunk"]:
    ratios = ["%s %.2f×" % (r["contender"], r["cpu_us_per_chunk"] / ilb["cpu_us_per_chunk"])
              for r in rows if r["contender"] not in ("ilb", "ilb-tls", "direct") and r["cpu_us_per_chunk"]]
    if ratios:
        print("\nPeer CPU per chunk over ilb's: " + ", ".join(ratios))
PY
}

section_kit() {
  [ -x "$VENV/bin/vllm-router" ] || die "the peers are not installed: run $PEERS_KIT/setup.sh"
  echo "== kit: ilb as the candidate (nonstream, delay, stream-ttft) -> $OUT/kit-ilb"
  CANDIDATE_NAME=ilb CANDIDATE_CMD="$ILB --log warn data-plane --listen 127.0.0.1:{port} {engine_flags} $ILB_ARGS" \
    ONLY="nonstream delay stream-ttft" DUR=$KIT_DUR WARM=$KIT_WARM OUT=$OUT/kit-ilb "$PEERS_KIT/run.sh" || true
  echo "== kit: envoy as the candidate (nonstream, delay) -> $OUT/kit-envoy"
  CANDIDATE_NAME=envoy CANDIDATE_CMD="$PEERS_KIT/envoy-candidate.sh {port} {workers_csv}" \
    CONTENDERS="vllm-router candidate" ONLY="nonstream delay" DUR=$KIT_DUR WARM=$KIT_WARM OUT=$OUT/kit-envoy \
    "$PEERS_KIT/run.sh" || true
  "$PY" - "$OUT/kit-ilb/results.jsonl" "$OUT/kit-envoy/results.jsonl" <<'PY' | tee "$OUT/kit.md"
import json, sys
runs = {}
for label, path in (("ilb run", sys.argv[1]), ("envoy run", sys.argv[2])):
    try:
        runs[label] = [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        runs[label] = []
print()
print("| section | run | contender | router CPU µs/req | over vllm-router | p99 ms | RSS peak MB |")
print("|---|---|---|---:|---:|---:|---:|")
for section in ("nonstream", "delay"):
    for label, rows in runs.items():
        rows = [r for r in rows if r["section"] == section]
        vllm = next((r["router_cpu_us_per_req"] for r in rows if r["role"] == "vllm-router"), None)
        for r in rows:
            cpu = r["router_cpu_us_per_req"]
            ratio = "-" if cpu is None or not vllm else "%.3f" % (cpu / vllm)
            print("| %s | %s | %s | %s | %s | %.2f | %s |" % (section, label, r["contender"], "-" if cpu is None else cpu,
                  ratio, r["p99_ms"], r["router_rss_peak_mb"] if r["router_rss_peak_mb"] is not None else "-"))
ttft = [r for r in runs["ilb run"] if r["section"] == "stream-ttft"]
if ttft:
    print("\nstream-ttft (p50 / p99 ms): " + ", ".join("%s %.3f / %.3f" % (r["contender"], r["ttft_p50_ms"], r["ttft_p99_ms"]) for r in ttft))
PY
}

echo "# results -> $OUT (load average at start: $(cut -d' ' -f1-3 /proc/loadavg))"
for s in $SECTIONS; do
  case $s in
    streams) section_streams ;;
    kit) section_kit ;;
    *) die "unknown section '$s' (streams, kit)" ;;
  esac
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
