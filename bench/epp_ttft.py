#!/usr/bin/env python3
"""Time to first streamed token through one endpoint, at concurrency 1, with a prompt of a chosen size.

Sends N sequential streaming chat completions (after a warm-up) over ONE keep-alive connection
and times each from the moment the request is written to the first SSE `data:` event. Each
request's prompt is PROMPT_BYTES long (the peer kit's ttft.py uses one short prompt). Standard
library only; prints one JSON object on stdout.
Usage: epp_ttft.py --port PORT [--n 200] [--warmup 10] [--prompt-bytes 100] [--max-tokens 4]
"""
import argparse
import http.client
import json
import math
import socket
import statistics
import time


def percentile(sorted_values, q):
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--prompt-bytes", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--model", default="mock-model")
    args = ap.parse_args()

    words = ("the quick brown fox jumps over the lazy dog " * (args.prompt_bytes // 44 + 1))[: args.prompt_bytes]
    body = json.dumps({
        "model": args.model,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": args.max_tokens,
        "stream": True,
    }).encode()
    conn = http.client.HTTPConnection(args.host, args.port, timeout=30)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ttfts, errors = [], 0
    for i in range(args.warmup + args.n):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = None
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data:") and first is None:
                first = time.perf_counter()
            if line[5:].strip() == b"[DONE]":
                break
        resp.read()
        if resp.status != 200 or first is None:
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection(args.host, args.port, timeout=30)
            continue
        if i >= args.warmup:
            ttfts.append((first - t0) * 1e3)
    ttfts.sort()
    print(json.dumps({
        "n": len(ttfts),
        "errors": errors,
        "prompt_bytes": len(body),
        "p50_ms": round(percentile(ttfts, 50), 3) if ttfts else None,
        "p90_ms": round(percentile(ttfts, 90), 3) if ttfts else None,
        "p99_ms": round(percentile(ttfts, 99), 3) if ttfts else None,
        "mean_ms": round(statistics.fmean(ttfts), 3) if ttfts else None,
    }))


if __name__ == "__main__":
    main()
