"""Run llama.cpp's own HTTP server (embedded in the `xllamacpp` wheel) on loopback until
SIGTERM/SIGINT. Used by scripts/real-engines.sh; usage:
    python llamacpp-serve.py MODEL.gguf PORT [--slots N] [--threads N] [--ctx N] [--alias NAME]
"""
import argparse
import signal
import sys
import threading

import xllamacpp


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("port", type=int)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=4096, help="total context, shared by the slots")
    ap.add_argument("--alias", default="")
    a = ap.parse_args()

    p = xllamacpp.CommonParams()
    p.model.path = a.model
    p.hostnames = ["127.0.0.1"]
    p.port = a.port
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.n_parallel = a.slots
    p.n_ctx = a.ctx
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    p.n_threads_http = 4
    p.ui = False
    p.cache_prompt = True
    if a.alias:
        p.model_alias = {a.alias}

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xllamacpp.Server(p)
    print(f"llama.cpp (xllamacpp {xllamacpp.__version__}) listening on "
          f"{server.listening_address}", flush=True)
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
