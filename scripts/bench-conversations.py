#!/usr/bin/env python3
"""Multi-turn conversations through a router to two real llama.cpp engines (issue 14, item 5).

Starts two llama.cpp servers on loopback (scripts/llamacpp-serve.py: the `xllamacpp` wheel
serving Gemma 3 270M Q4_K_M, as `scripts/real-engines.sh install` installs them; one thread and
2 slots each), starts the router under test in front of them, runs the workload, and prints one
JSON line per run. Engines and router are started fresh for every run (no prompt cache, no
router state carried over), and only the processes this script started are stopped (by recorded
PID and process start time, each in its own process group). Standard library only.

    python3 scripts/bench-conversations.py --router ilb --runs 2
    python3 scripts/bench-conversations.py --router ilb --replicas 4 --runs 2            # with --peer
    python3 scripts/bench-conversations.py --router ilb --replicas 4 --no-ilb-peers      # each alone
    python3 scripts/bench-conversations.py --router sglang:cache_aware --replicas 4
    python3 scripts/bench-conversations.py --router sglang:cache_aware --runs 2
    python3 scripts/bench-conversations.py --router vllm:consistent_hash
    python3 scripts/bench-conversations.py --router-cmd 'my-router --port {port} {engine_flags}'
    python3 scripts/bench-conversations.py table target/bench-conversations/*/results.jsonl

Routers (`--router`): `ilb` (quick mode: `ilb data-plane --listen ... --engine A --engine B`,
binary from --ilb-bin), `sglang:POLICY` (`smg launch`, sglang-router) and `vllm:POLICY`
(`vllm-router`), both from the venv of ../shared/bench/peers/setup.sh (--peers-venv), `direct`
(no router: each conversation goes to engine A or B by its index, even/odd), or `--router-cmd`,
a command template with {port}, {engine_flags} (`--engine URL ...`), {workers} (space
separated) and {workers_csv}.

Replicas (`--replicas N`, issue 31): N router processes in front of the same engines, on ports
--router-port + 100·i, and every request (every turn) goes to one of them at random (seeded by
--seed, conversation and turn, so every run sends the same turns to the same replicas), as
behind a Service. ilb's replicas name each other with `--peer` (each other's client URL; no
admin listener) unless --no-ilb-peers; the label says which (`ilb-4r-peers`, `ilb-4r-alone`).

Workload (defaults): 16 conversations of 4 turns, 4 at a time (a conversation starts when one
finishes), each with its own `x-session-id` (the same ids in every run). The first user message
holds a ~420-word document (different for every conversation, generated from a fixed seed) and a
question; each later turn appends the assistant's answer and a new question. Every turn is a
streamed chat completion with temperature 0, `max_tokens` 32 and `ignore_eos` (llama.cpp), so
every answer has the same length whatever the router.

Per run it reports: TTFT (request sent -> first SSE chunk with content) of follow-up turns
(2-4) p50/mean/p90 and of first turns; the share of prompt tokens served from the engines'
prompt cache, from the per-response `timings` (`cache_n` / (`cache_n` + `prompt_n`)) and from
the engines' `/metrics` counters (`llamacpp:prompt_tokens_cached_total` and
`llamacpp:prompt_tokens_total`, which excludes cached tokens); follow-ups that missed their
prefix (fewer than 90 % of the previous turn's prompt tokens cached); prompt tokens per engine;
wall time; the machine's load average at the start and end. `placement` says, for any router,
which engine served each turn of each conversation (from the engines' logs, see
attribute_engines), how many conversations were active on each engine when each one started,
how many started on the busier engine, and how many follow-ups changed engine; for ilb,
`router_view_disagrees` compares that with `/debug/route` after each first turn. Details (every
request, engine and router logs, both /metrics before and after) go to --out.
"""
import argparse
import http.client
import json
import os
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILE = "models/gemma-3-270m-q4_k_m.gguf"
MODEL_ALIAS = "gemma-3-270m"

# ---------------------------------------------------------------------------------------------
# Processes: started in their own session, stopped only through their recorded PID and start time


def proc_start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


class Proc:
    live = []  # everything started and not yet stopped, for the exit handler

    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.popen = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env=env)
        self.pid = self.popen.pid
        self.start_time = proc_start_time(self.pid)
        Proc.live.append(self)

    def alive(self):
        return self.popen.poll() is None

    def ours(self):
        return self.start_time is not None and proc_start_time(self.pid) == self.start_time

    def stop(self, timeout_s=15.0):
        if self in Proc.live:
            Proc.live.remove(self)
        # The process leads its own group (start_new_session): children go with it.
        if self.alive() and self.ours():
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # leftovers of the group; the group id is ours
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


def stop_all():
    for p in list(Proc.live):
        p.stop()


def port_free(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# ---------------------------------------------------------------------------------------------
# HTTP helpers


def http_get(url, timeout=5.0):
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        path = u.path + (f"?{u.query}" if u.query else "")
        c.request("GET", path or "/")
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def try_get(url, timeout=5.0):
    try:
        return http_get(url, timeout)
    except (OSError, http.client.HTTPException):
        return None, b""


def wait_until(what, check, timeout_s, proc=None):
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what}: process exited (log: {proc.log_path})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(0.3)


def llama_metrics(base):
    status, body = http_get(f"{base}/metrics", 10)
    if status != 200:
        raise RuntimeError(f"{base}/metrics answered {status}")
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.split()[:2]
            out[name[len("llamacpp:"):]] = float(value)
    return out, body.decode()


# ---------------------------------------------------------------------------------------------
# The workload

WORDS = {
    "adj": "quiet northern early careful small coastal old busy modest rural public wide steady "
           "local gradual remote annual shallow narrow practical".split(),
    "noun": "harbour council railway orchard bridge market archive ferry library canal mill "
            "school festival quarry lighthouse garden museum valley reservoir workshop".split(),
    "verb": "rebuilt expanded repaired opened funded studied recorded moved protected renamed "
            "measured restored planned surveyed supplied".split(),
    "place": "Alder Bay|Kestrel Ford|Marrow Hill|Oakmere|Pellham|Quarry End|Redwater|Stonebridge|"
             "Thornby|Wexcombe|Brindle Cross|Eastholm|Fallowmere|Greywick|Hollins|Lowmoor".split("|"),
    "person": "Ada Marsh|Tom Reyes|Ines Cole|Hugo Brandt|Mei Lin|Omar Haddad|Lena Voss|Raj Patel|"
              "Nora Quinn|Felix Dorn|Sara Lind|Ivo Petrov".split("|"),
}
QUESTIONS = [
    "Read the document above and tell me in two sentences what it is mainly about.",
    "Which people does the document name, and what did each of them do?",
    "List the years mentioned in the document, in order.",
    "What would you ask the council next, based on this document?",
]


def document(conv, words):
    """A ~`words`-word plain English report, different for every conversation, from a fixed seed."""
    rng = random.Random(1000 + conv)
    place = WORDS["place"][conv % len(WORDS["place"])]
    out = [f"Report {conv + 1} on the town of {place}."]
    n = len(out[0].split())
    while n < words:
        pick = lambda k: rng.choice(WORDS[k])
        year = rng.randint(1850, 2020)
        templates = [
            f"In {year} the {pick('adj')} {pick('noun')} of {place} was {pick('verb')} by {pick('person')}.",
            f"Records from {year} show that the {pick('noun')} near the {pick('adj')} {pick('noun')} was {pick('verb')} twice.",
            f"{pick('person')} wrote that the {pick('adj')} {pick('noun')} needed more work than the {pick('noun')}.",
            f"By {year} the town had {rng.randint(2, 90)} families living beside the {pick('adj')} {pick('noun')}.",
            f"The {pick('noun')} committee {pick('verb')} the {pick('adj')} {pick('noun')} after a {pick('adj')} winter.",
        ]
        s = rng.choice(templates)
        out.append(s)
        n += len(s.split())
    return " ".join(out)


def stream_turn(conn, model, messages, session, max_tokens):
    body = json.dumps({
        "model": model, "messages": messages, "stream": True, "max_tokens": max_tokens,
        "temperature": 0, "seed": 0, "ignore_eos": True,
        "stream_options": {"include_usage": True},
    })
    headers = {"content-type": "application/json", "x-session-id": session}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, headers)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    first = None
    text = []
    usage = timings = None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        if chunk.get("timings"):
            timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                if first is None:
                    first = time.perf_counter()
                text.append(content)
    end = time.perf_counter()
    if first is None:
        raise RuntimeError("stream had no content")
    return {"ttft_s": first - t0, "total_s": end - t0, "t_start": t0, "t_end": end,
            "text": "".join(text), "usage": usage, "timings": timings}


def run_workload(target_for, model, args, router_view):
    """Runs every conversation (`target_for(conv, turn)` is the base URL a turn is sent to); returns the
    per-turn records. `router_view(session)`, if given, is asked after each first turn which
    engine the router remembers for the conversation (ilb: /debug/route)."""
    records = []
    lock = threading.Lock()

    def conversation(conv):
        session = f"bench-conv-{conv:02d}"
        messages = [{"role": "user", "content": document(conv, args.words) + "\n\n" + QUESTIONS[0]}]
        prev_prompt = None
        for turn in range(args.turns):
            if turn > 0:
                messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            # A connection per turn, as a client that reconnects: reusing one, llama.cpp's
            # server closed it after a 20 s streamed first turn (seen when sent direct).
            u = urllib.parse.urlsplit(target_for(conv, turn))
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=args.request_timeout)
            try:
                rec = stream_turn(conn, model, messages, session, args.max_tokens)
            finally:
                conn.close()
            messages.append({"role": "assistant", "content": rec["text"]})
            t = rec["timings"] or {}
            cache_n, prompt_n = t.get("cache_n"), t.get("prompt_n")
            row = {"conv": conv, "turn": turn + 1, "session": session,
                   "ttft_s": round(rec["ttft_s"], 4), "total_s": round(rec["total_s"], 4),
                   "t_start": rec["t_start"], "t_end": rec["t_end"],
                   "prompt_tokens": (rec["usage"] or {}).get("prompt_tokens"),
                   "completion_tokens": (rec["usage"] or {}).get("completion_tokens"),
                   "cache_n": cache_n, "prompt_n": prompt_n}
            # A follow-up that found less than 90 % of the previous turn's prompt cached lost
            # its prefix (another engine, or its slot was reused).
            if turn > 0 and prev_prompt and cache_n is not None:
                row["prefix_missed"] = cache_n < 0.9 * prev_prompt
            prev_prompt = row["prompt_tokens"]
            if turn == 0 and router_view:
                row["router_remembers"] = router_view(session)
            with lock:
                records.append(row)

    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        for f in [pool.submit(conversation, c) for c in range(args.conversations)]:
            f.result()
    return records


def engine_log_tasks(path):
    """Finished tasks in a llama.cpp log: ((prompt tokens evaluated, tokens in the slot at
    release), seconds since the process started, as the log's M.SS.mmm.uuu stamp says)."""
    evals, out = {}, []
    for line in open(path, errors="replace"):
        m = re.search(r"\| task (\d+) \| prompt eval time = +[\d.]+ ms / +(\d+) tokens", line)
        if m:
            evals[m.group(1)] = int(m.group(2))
            continue
        m = re.match(r"(\d+)\.(\d+)\.(\d+)\.(\d+) .*\| task (\d+) \| stop processing: n_tokens = (\d+)", line)
        if m and m.group(5) in evals:
            mins, secs, ms, us = (int(g) for g in m.groups()[:4])
            out.append(((evals.pop(m.group(5)), int(m.group(6))), mins * 60 + secs + ms / 1e3 + us / 1e6))
    return out


def attribute_engines(records, logs):
    """Which engine served each request, for any router: llama.cpp logs every task's evaluated
    prompt tokens and the tokens its slot held at release (prompt + completion - 1). A pair
    found once in all the logs names the engine; those matches also give each log's clock
    offset, and a pair found more than once goes to the entry whose release time is nearest
    the request's end. Requests left unmatched get `engine` None."""
    tasks = [(e, key, t) for e, path in zip("ab", logs) for key, t in engine_log_tasks(path)]
    key_of = lambda r: (None if None in (r["prompt_n"], r["prompt_tokens"], r["completion_tokens"])
                        else (r["prompt_n"], r["prompt_tokens"] + r["completion_tokens"] - 1))
    count = {}
    for r in records:
        count[key_of(r)] = count.get(key_of(r), 0) + 1
    used, offsets = set(), {}
    for r in records:
        r["engine"] = None
        hits = [i for i, (_, key, _) in enumerate(tasks) if key == key_of(r)]
        if len(hits) == 1 and count[key_of(r)] == 1:
            e, _, t = tasks[hits[0]]
            r["engine"] = e
            used.add(hits[0])
            offsets.setdefault(e, []).append(r["t_end"] - t)
    offset = {e: statistics.median(v) for e, v in offsets.items()}
    for r in sorted((r for r in records if r["engine"] is None), key=lambda r: r["t_end"]):
        hits = [i for i, (e, key, _) in enumerate(tasks) if key == key_of(r) and i not in used and e in offset]
        if hits:
            best = min(hits, key=lambda i: abs(r["t_end"] - tasks[i][2] - offset[tasks[i][0]]))
            r["engine"] = tasks[best][0]
            used.add(best)


def placement(records, n_engines):
    """Per conversation its engines; how many conversations were active on each engine when it
    started (a conversation is active from its first request to the end of its last)."""
    convs = {}
    for r in sorted(records, key=lambda r: r["t_start"]):
        c = convs.setdefault(r["conv"], {"start": r["t_start"], "end": r["t_end"], "engines": []})
        c["end"] = max(c["end"], r["t_end"])
        c["engines"].append(r["engine"])
    placed, busier, moves = [], 0, 0
    for conv, c in sorted(convs.items()):
        home = c["engines"][0]
        active = {e: 0 for e in "ab"[:n_engines]}
        for other, o in convs.items():
            if other != conv and o["start"] < c["start"] < o["end"] and o["engines"][0] in active:
                active[o["engines"][0]] += 1
        if home in active and active[home] > min(v for e, v in active.items() if e != home):
            busier += 1
        moves += sum(1 for a, b in zip(c["engines"], c["engines"][1:]) if a and b and a != b)
        placed.append({"conv": conv, "engines": "".join(e or "?" for e in c["engines"]),
                       "active_at_start": "".join(f"{e}{v}" for e, v in active.items())})
    per_engine = {e: sum(1 for p in placed if p["engines"][0] == e) for e in "ab"[:n_engines]}
    return {"conversations": placed, "conversations_per_engine": per_engine,
            "placed_on_busier_engine": busier, "followups_moved": moves,
            "requests_unattributed": sum(1 for r in records if r["engine"] is None)}


def summarize(records):
    follow = [r["ttft_s"] for r in records if r["turn"] > 1]
    first = [r["ttft_s"] for r in records if r["turn"] == 1]

    def pct(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None

    def share(rows):
        c = sum(r["cache_n"] or 0 for r in rows)
        n = sum(r["prompt_n"] or 0 for r in rows)
        return round(c / (c + n), 4) if c + n else None

    r3 = lambda x: None if x is None else round(x, 3)
    return {
        "followup_ttft_s": {"p50": r3(statistics.median(follow)) if follow else None,
                            "mean": r3(statistics.fmean(follow)) if follow else None,
                            "p90": r3(pct(follow, 90)), "max": r3(max(follow)) if follow else None,
                            "n": len(follow)},
        "first_turn_ttft_s": {"p50": r3(statistics.median(first)) if first else None,
                              "mean": r3(statistics.fmean(first)) if first else None},
        "cache_share_timings": share(records),
        "cache_share_timings_followups": share([r for r in records if r["turn"] > 1]),
        "followups_prefix_missed": sum(1 for r in records if r.get("prefix_missed")),
    }


# ---------------------------------------------------------------------------------------------
# Routers


def router_argv(args, port, metrics_port, workers):
    flags = []
    for w in workers:
        flags += ["--engine", w]
    if args.router_cmd:
        fields = {"port": str(port), "engine_flags": " ".join(shlex.quote(f) for f in flags),
                  "workers": " ".join(workers), "workers_csv": ",".join(workers)}
        return shlex.split(args.router_cmd.format(**fields)), "custom"
    kind, _, policy = args.router.partition(":")
    if kind == "ilb":
        peers = [] if args.no_ilb_peers else [f for p in args.replica_ports if p != port
                                               for f in ("--peer", f"http://127.0.0.1:{p}")]
        if peers and args.ilb_peer_interval_ms:
            peers += ["--peer-interval-ms", str(args.ilb_peer_interval_ms)]
        return [args.ilb_bin, "--log", "warn", "data-plane", "--listen", f"127.0.0.1:{port}", *flags, *peers], "ilb"
    if kind == "sglang":
        return [os.path.join(args.peers_venv, "bin", "smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *workers, "--policy", policy or "cache_aware", "--log-level", "warn",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)], "peer"
    if kind == "vllm":
        return [os.path.join(args.peers_venv, "bin", "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *workers, "--policy", policy or "cache_aware", "--log-level", "warning",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)], "peer"
    raise SystemExit(f"unknown --router {args.router!r} (ilb, sglang:POLICY, vllm:POLICY, direct)")


def router_ready(kind, base, workers, model):
    def check():
        status, body = try_get(f"{base}/v1/models")
        if status != 200:
            return False
        if kind == "ilb":
            status, body = try_get(f"{base}/debug/route?model={model}&key=ready")
            return status == 200 and len(json.loads(body).get("candidates", [])) == len(workers)
        if kind == "peer":
            status, body = try_get(f"{base}/workers")
            return status == 200 and body.count(b'"is_healthy":true') >= len(workers)
        return True
    return check


# ---------------------------------------------------------------------------------------------


def one_run(args, run_no, out_dir):
    ports = args.engine_ports
    engines = [f"http://127.0.0.1:{p}" for p in ports]
    metrics_ports = [args.router_metrics_port + 100 * i for i in range(args.replicas)]
    for p in ports + args.replica_ports + metrics_ports:
        if not port_free(p):
            raise RuntimeError(f"port {p} on 127.0.0.1 is in use; pick others (--engine-ports, --router-port)")
    model_path = os.path.join(args.llama_dir, MODEL_FILE)
    py = os.path.join(args.llama_dir, "llama-venv", "bin", "python")
    for f in (model_path, py):
        if not os.path.exists(f):
            raise SystemExit(f"{f} missing: run scripts/real-engines.sh install, "
                             "or point --llama-dir / ILB_BENCH_LLAMA_DIR at its target/real-engines")
    tag = f"run{run_no}"
    procs = []
    try:
        for i, p in enumerate(ports):
            procs.append(Proc(f"engine-{i}", [py, os.path.join(ROOT, "scripts", "llamacpp-serve.py"), model_path, str(p),
                                              "--slots", str(args.slots), "--threads", str(args.threads),
                                              "--ctx", str(args.ctx), "--alias", MODEL_ALIAS],
                              os.path.join(out_dir, f"{tag}-engine-{'ab'[i]}.log")))
        for e, p in zip(engines, procs):
            wait_until(f"engine {e}", lambda e=e: try_get(f"{e}/health")[0] == 200
                       and try_get(f"{e}/v1/models")[0] == 200, 300, p)
        # Warm each engine directly (first-request graph set-up), then take the counters' baseline.
        for e in engines:
            u = urllib.parse.urlsplit(e)
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
            stream_turn(c, MODEL_ALIAS, [{"role": "user", "content": "Say hello."}], "warmup", 4)
            c.close()
        before = [llama_metrics(e) for e in engines]

        router = None
        router_view = None
        if args.router == "direct" and not args.router_cmd:
            base = None
            target_for = lambda conv, turn: engines[conv % len(engines)]
        else:
            bases = []
            for i, (port, metrics_port) in enumerate(zip(args.replica_ports, metrics_ports)):
                argv, kind = router_argv(args, port, metrics_port, engines)
                suffix = f"-{i}" if args.replicas > 1 else ""
                with open(os.path.join(out_dir, f"{tag}-router{suffix}-cmd.txt"), "w") as f:
                    f.write(shlex.join(argv) + "\n")
                replica = Proc(f"router{suffix}", argv, os.path.join(out_dir, f"{tag}-router{suffix}.log"))
                procs.append(replica)
                router = router or replica
                bases.append(f"http://127.0.0.1:{port}")
                wait_until(f"router {args.router}{suffix}", router_ready(kind, bases[-1], engines, MODEL_ALIAS), 60,
                           replica)
            base = bases[0]
            # Each turn to a replica drawn from a generator seeded by the run's seed, the
            # conversation and the turn: the same draws in every run and for every router.
            target_for = lambda conv, turn: random.Random(f"{args.seed}-{conv}-{turn}").choice(bases)
            if kind == "ilb":
                names = {e.split("//", 1)[1]: "ab"[i] for i, e in enumerate(engines)}

                def router_view(session):
                    status, body = try_get(f"{base}/debug/route?model={MODEL_ALIAS}&key={session}")
                    return names.get(json.loads(body).get("remembered")) if status == 200 else None

        load_start = os.getloadavg()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.perf_counter()
        records = run_workload(target_for, MODEL_ALIAS, args, router_view)
        wall = time.perf_counter() - t0
        load_end = os.getloadavg()

        after = [llama_metrics(e) for e in engines]
        per_engine = []
        cached = processed = 0.0
        for e, (b, braw), (a, araw), letter in zip(engines, before, after, "ab"):
            dc = a["prompt_tokens_cached_total"] - b["prompt_tokens_cached_total"]
            dp = a["prompt_tokens_total"] - b["prompt_tokens_total"]
            cached += dc
            processed += dp
            per_engine.append({"engine": e, "prompt_tokens_cached": int(dc), "prompt_tokens_processed": int(dp),
                               "tokens_predicted": int(a["tokens_predicted_total"] - b["tokens_predicted_total"])})
            with open(os.path.join(out_dir, f"{tag}-engine-{letter}-metrics.txt"), "w") as f:
                f.write(braw + "\n# ---- after ----\n" + araw)
        if router is not None:  # the router's own metrics, for the record
            peer = args.router.startswith(("sglang", "vllm")) and not args.router_cmd
            status, body = try_get(f"http://127.0.0.1:{args.router_metrics_port}/metrics" if peer else f"{base}/metrics")
            if status == 200:
                with open(os.path.join(out_dir, f"{tag}-router-metrics.txt"), "wb") as f:
                    f.write(body)
        logs = [os.path.join(out_dir, f"{tag}-engine-{'ab'[i]}.log") for i in range(len(engines))]
        deadline = time.monotonic() + 10  # the engines log a task's release as its stream ends
        while True:
            attribute_engines(records, logs)
            if all(r["engine"] for r in records) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        t_base = min(r["t_start"] for r in records)
        with open(os.path.join(out_dir, f"{tag}-requests.jsonl"), "w") as f:
            for r in sorted(records, key=lambda r: r["t_start"]):
                r = dict(r, t_start=round(r["t_start"] - t_base, 3), t_end=round(r["t_end"] - t_base, 3))
                f.write(json.dumps(r) + "\n")
        result = {
            "router": args.label, "run": run_no, "started_utc": started, "replicas": args.replicas,
            "load_1m_start": round(load_start[0], 2), "load_1m_end": round(load_end[0], 2),
            "load_5m_end": round(load_end[1], 2), "wall_s": round(wall, 1),
            **summarize(records),
            "cache_share_metrics": round(cached / (cached + processed), 4) if cached + processed else None,
            "engines": per_engine,
            "workload": {"conversations": args.conversations, "turns": args.turns, "concurrency": args.concurrency,
                         "words": args.words, "max_tokens": args.max_tokens, "slots": args.slots,
                         "threads": args.threads, "ctx": args.ctx},
        }
        result["placement"] = placement(records, len(engines))
        views = [r for r in records if "router_remembers" in r]
        if views:  # the router's own view (ilb's /debug/route) against the engines' logs
            result["placement"]["router_view_disagrees"] = sum(
                1 for r in views if r["engine"] and r["router_remembers"] != r["engine"])
        return result
    finally:
        for p in reversed(procs):
            p.stop()


def table(paths):
    """A markdown table of the JSON lines in `paths` (results.jsonl files or saved stdout)."""
    print("| router | run | started (UTC) | follow-up TTFT p50 / mean / p90 s | first-turn TTFT p50 s "
          "| cache share (timings / metrics) | prefix misses | wall s | load 1m start / end |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                ft = r["followup_ttft_s"]
                print(f"| {r['router']} | {r['run']} | {r['started_utc'][11:16]} | {ft['p50']:.2f} / {ft['mean']:.2f} / "
                      f"{ft['p90']:.2f} | {r['first_turn_ttft_s']['p50']:.2f} | {100 * r['cache_share_timings']:.1f} % / "
                      f"{100 * r['cache_share_metrics']:.1f} % | {r['followups_prefix_missed']} / {ft['n']} | "
                      f"{r['wall_s']:.0f} | {r['load_1m_start']:.1f} / {r['load_1m_end']:.1f} |")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "table":
        return table(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--router", default="ilb", help="ilb | sglang:POLICY | vllm:POLICY | direct")
    ap.add_argument("--router-cmd", help="a router command template instead of --router")
    ap.add_argument("--router-name", help="the label in the output (default: --router)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--words", type=int, default=420, help="words of each conversation's document")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=4096, help="each engine's total context, shared by its slots")
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--llama-dir", default=os.environ.get("ILB_BENCH_LLAMA_DIR",
                                                         os.path.join(ROOT, "target", "real-engines")),
                    help="the cache of scripts/real-engines.sh: llama-venv/ and models/ (read only)")
    ap.add_argument("--ilb-bin", default=os.path.join(ROOT, "target", "release", "ilb"))
    ap.add_argument("--peers-venv", default=os.path.join(os.environ.get("PEERS_HOME", "/tmp/ilb-peers"), "venv"))
    ap.add_argument("--engine-ports", type=lambda s: [int(x) for x in s.split(",")], default=[18721, 18722])
    ap.add_argument("--router-port", type=int, default=18720)
    ap.add_argument("--router-metrics-port", type=int, default=18729)
    ap.add_argument("--replicas", type=int, default=1, help="router processes; each request to a random one")
    ap.add_argument("--no-ilb-peers", action="store_true", help="ilb replicas without --peer (each decides alone)")
    ap.add_argument("--ilb-peer-interval-ms", type=int, help="ilb's --peer-interval-ms (default: ilb's, 200)")
    ap.add_argument("--seed", default="31", help="seeds which replica each turn goes to")
    ap.add_argument("--out", help="details folder (default target/bench-conversations/<UTC time>-<router>)")
    args = ap.parse_args()
    if args.router_cmd and not args.router_name:
        args.router_name = "custom"
    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1")
    args.replica_ports = [args.router_port + 100 * i for i in range(args.replicas)]
    args.label = args.router_name or args.router
    if args.replicas > 1 and not args.router_name:
        mode = ("-alone" if args.no_ilb_peers else "-peers") if args.router == "ilb" else ""
        args.label = f"{args.router}-{args.replicas}r{mode}"
    label = args.label.replace(":", "-").replace("/", "-")
    out_dir = args.out or os.path.join(ROOT, "target", "bench-conversations",
                                       time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + label)
    os.makedirs(out_dir, exist_ok=True)

    def on_signal(sig, _frame):
        stop_all()
        sys.exit(128 + sig)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"bench-conversations: details in {out_dir}", file=sys.stderr)
    try:
        with open(os.path.join(out_dir, "results.jsonl"), "a") as results:
            for run_no in range(1, args.runs + 1):
                result = one_run(args, run_no, out_dir)
                line = json.dumps(result)
                print(line, flush=True)
                results.write(line + "\n")
                results.flush()
    finally:
        stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
