#!/usr/bin/env bash
# Capture an engine's raw HTTP surface for metric-parser fixtures and proxy work:
#   scripts/capture-engine.sh KIND VERSION BASE_URL MODEL OUTDIR
# writes OUTDIR/KIND-VERSION-{health,models,metrics-idle,metrics-after,chat-stream,
# chat,completions-stream,responses-stream}.txt. Each file's first line names the engine and
# version; the rest is what the engine sent (headers included where the name says so).
set -euo pipefail
kind=$1 version=$2 base=$3 model=$4 out=$5
mkdir -p "$out"
p="$out/$kind-$version"
hdr() { echo "# $kind $version: $1 (captured $(date -u +%FT%TZ) from $base)"; }
long_prompt=$(python3 -c "import sys; print(' '.join(f'word{i}' for i in range(int(sys.argv[1]))))" "${LONG_WORDS:-300}")

{ hdr "GET /health, status + headers + body"; curl -sS -D - "$base/health"; echo; } > "$p-health.txt"
{ hdr "GET /v1/models, headers + body"; curl -sS -D - "$base/v1/models"; echo; } > "$p-models.txt"
{ hdr "GET /metrics idle, headers + body"; curl -sS -D - "$base/metrics"; } > "$p-metrics-idle.txt"

chat() { # stream? max_tokens content
  printf '{"model":"%s","stream":%s,"max_tokens":%s,"temperature":0,%s"messages":[{"role":"user","content":"%s"}]}' \
    "$model" "$1" "$2" "$( [ "$1" = true ] && echo '"stream_options":{"include_usage":true},' )" "$3"
}
{ hdr "POST /v1/chat/completions stream=true include_usage, curl -sN -D -"
  curl -sSN -D - "$base/v1/chat/completions" -H 'content-type: application/json' \
    -d "$(chat true 16 'Say hello in five words.')"; } > "$p-chat-stream.txt"
{ hdr "POST /v1/chat/completions non-streaming, headers + body"
  curl -sS -D - "$base/v1/chat/completions" -H 'content-type: application/json' \
    -d "$(chat false 16 'Say hello in five words.')"; echo; } > "$p-chat.txt"
{ hdr "POST /v1/completions stream=true, curl -sN -D -"
  curl -sSN -D - "$base/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"$model\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"stream\":true,\"temperature\":0}"; } > "$p-completions-stream.txt"
{ hdr "POST /v1/responses stream=true, curl -sN -D -"
  curl -sSN -D - "$base/v1/responses" -H 'content-type: application/json' \
    -d "{\"model\":\"$model\",\"input\":\"Say hi.\",\"max_output_tokens\":8,\"stream\":true}"; } > "$p-responses-stream.txt" || true
{ hdr "POST /v1/responses non-streaming, headers + body"
  curl -sS -D - "$base/v1/responses" -H 'content-type: application/json' \
    -d "{\"model\":\"$model\",\"input\":\"Say hi.\",\"max_output_tokens\":8}"; echo; } > "$p-responses.txt" || true
{ hdr "POST /v1/chat/completions with malformed JSON, headers + body"
  curl -sS -D - "$base/v1/chat/completions" -H 'content-type: application/json' -d '{"model": nope'; echo; } > "$p-malformed.txt"
{ hdr "POST /v1/chat/completions with an unknown model, headers + body"
  curl -sS -D - "$base/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"no-such-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}'; echo; } > "$p-unknown-model.txt"

# Load, including repeated long prompts (prefix/prompt cache hits), a few concurrent streams.
for i in 1 2 3; do
  curl -sS -o /dev/null "$base/v1/chat/completions" -H 'content-type: application/json' \
    -d "$(chat false 8 "$long_prompt")"
done
pids=()
for i in 1 2 3 4 5 6; do
  curl -sS -o /dev/null "$base/v1/chat/completions" -H 'content-type: application/json' \
    -d "$(chat true "${BUSY_TOKENS:-24}" "Count to $i.")" & pids+=($!)
done
sleep 1
{ hdr "GET /metrics while 6 streams run, headers + body"; curl -sS -D - "$base/metrics"; } > "$p-metrics-busy.txt"
wait "${pids[@]}"
{ hdr "GET /metrics after ~14 requests incl. 3 repeated ${LONG_WORDS:-300}-word prompts, headers + body"
  curl -sS -D - "$base/metrics"; } > "$p-metrics-after.txt"
echo "captured $p-*"
