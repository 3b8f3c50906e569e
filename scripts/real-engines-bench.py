"""TTFT and decode speed of real engines, directly and through an ilb data plane, and what ilb
adds (paired: each request through ilb is sent next to one direct, alternating which goes
first, so engine drift cancels). Standard library only. Usage:

    python3 scripts/real-engines-bench.py N MAX_TOKENS NAME=ENGINE_URL=DATA_PLANE_URL [...]

where each DATA_PLANE_URL routes only to that engine (e.g. `ilb data-plane --engine URL`). TTFT
is request sent -> first SSE chunk with content; tokens/s is the usage's completion tokens over
first -> last content chunk. Prints one JSON object per engine.
"""
import http.client
import json
import statistics
import sys
import time
import urllib.parse


def model_of(url):
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]


def stream(url, model, max_tokens, i, tag=""):
    # A new client connection each time, on both paths (llama.cpp may close a kept-alive one).
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    body = json.dumps({
        "model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"Tell me a story about the number {i}{tag}."}],
    })
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json", "x-session-id": f"b{i}"})
    r = conn.getresponse()
    assert r.status == 200, (r.status, r.read())
    first = last = None
    tokens = 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            if (choice.get("delta") or {}).get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    conn.close()
    assert first is not None, "no content"
    return (first - start) * 1000, tokens / (last - first) if last > first and tokens > 1 else None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    n, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    for spec in sys.argv[3:]:
        name, engine, dp = spec.split("=")
        model = model_of(engine)
        conns = {"direct": engine, "ilb": dp}
        stream(conns["direct"], model, max_tokens, -1)  # warm both paths
        stream(conns["ilb"], model, max_tokens, -1)
        res = {"direct": [], "ilb": []}
        for i in range(n):
            # Alternate which path goes first, and give each its own prompt (same length), so
            # neither gains from the other's prompt cache or from going second.
            order = ("direct", "ilb") if i % 2 == 0 else ("ilb", "direct")
            for which in order:
                res[which].append(stream(conns[which], model, max_tokens, i, "A" if which == "direct" else "B"))
        added = [b[0] - a[0] for a, b in zip(res["direct"], res["ilb"])]
        out = {"engine": name, "model": model, "requests_per_path": n, "max_tokens": max_tokens}
        for which in ("direct", "ilb"):
            ttft = [r[0] for r in res[which]]
            tps = [r[1] for r in res[which] if r[1]]
            out[which] = {
                "ttft_ms_p50": round(statistics.median(ttft), 2), "ttft_ms_p99": round(pct(ttft, 99), 2),
                "tokens_per_s_p50": round(statistics.median(tps), 1) if tps else None,
            }
        out["ilb_adds_ttft_ms_p50"] = round(statistics.median(added), 2)
        out["ilb_adds_ttft_ms_p99"] = round(pct(added, 99), 2)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
