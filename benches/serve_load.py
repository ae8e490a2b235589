#!/usr/bin/env python3
"""Serving under load: aggregate tokens/s, time to first token and inter-token latency of
`mdsd serve` (batched, and with --max-batch 1) and llama.cpp's `llama-server` (its draft on),
at 1, 2, 4, 8 and 16 concurrent clients, on MT-Bench and Spec-Bench prompts.

Usage:
  python3 benches/serve_load.py --out benches/results/serve-load.json \
      [--engines mdsd,mdsd-b1,llama] [--clients 1,2,4,8,16] [--sets mt_bench,spec_bench] \
      [--max-tokens 128] [--requests 2] [--mdsd target/release/mdsd] \
      [--llama /tmp/peers/llama-cpp-cpu] [--target GGUF --draft GGUF] [--mdsd-eagle DIR] [--threads 2]

Each engine is started on the same GGUF files (default: the default pair from the mdsd cache),
at temperature 0 with 128-token answers (`ignore_eos`), chat completions streamed. A level of
C clients sends max(4, --requests x C) requests in all, C at a time: each of C client threads
takes the next prompt of the set as soon as its last answer ended (prompts: the first turn of each question, in file order,
from ../shared/data; each level starts where the last one stopped, so that no level finds its
prompts cached by an earlier one). Measured per request: time to the first streamed text (TTFT), the gaps
between streamed pieces (ITL; a speculative step may send several tokens at once), the
completion tokens (usage). Per level: aggregate tokens/s (all completion tokens over the wall
time of the level), TTFT and ITL p50/p99, and TTFT p50/p99 of the requests after the first
wave (the first C arrive at once, so their prefills queue behind each other whatever the
server does; later ones arrive one by one while the others decode). Writes every record and the summary to --out and
prints a Markdown table. Needs no package beyond the standard library.
"""
import argparse, http.client, json, os, signal, socket, subprocess, sys, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
CACHE = Path(os.environ.get("MDSD_CACHE", Path.home() / ".cache" / "mdsd"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_ready(port, proc, what, timeout=600):
    start = time.time()
    while time.time() - start < timeout:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode} before it was ready")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"{what} was not ready after {timeout} s")


def start_engine(name, a, max_clients):
    port = free_port()
    log = open(Path(a.out).with_suffix(f".{name}.log"), "w")
    if name.startswith("mdsd"):
        batch = "1" if name == "mdsd-b1" else str(max_clients)
        draft = ["--eagle", a.mdsd_eagle] if a.mdsd_eagle else ["--draft", a.draft]
        cmd = [a.mdsd, "serve", "--port", str(port), "--target", a.target, *draft,
               "--max-batch", batch, "--max-waiting", "256", "--context", str(a.context)] + a.mdsd_args.split()
        env = dict(os.environ, MDSD_OFFLINE="1")
    else:
        lib = a.llama
        cmd = [f"{lib}/llama-server", "-m", a.target, "-md", a.draft, "-np", str(max_clients),
               "-c", str(a.context * max_clients), "-t", str(a.threads), "-td", str(a.threads),
               "--port", str(port), "--temp", "0"] + a.llama_args.split()
        env = dict(os.environ, LD_LIBRARY_PATH=lib)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_ready(port, proc, name)
    return proc, port, cmd


def one_request(port, prompt, max_tokens):
    body = json.dumps({
        "model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    })
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    sent = time.time()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    times, pieces, usage = [], 0, None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    continue
                v = json.loads(data)
                if v.get("usage"):
                    usage = v["usage"]
                for ch in v.get("choices") or []:
                    text = (ch.get("delta") or {}).get("content")
                    if text:
                        times.append(time.time())
                        pieces += 1
    done = time.time()
    c.close()
    tokens = (usage or {}).get("completion_tokens") or pieces
    return {"sent": sent, "first": times[0] if times else None, "times": times, "done": done, "tokens": tokens}


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def run_level(port, prompts, clients, total, max_tokens, offset=0):
    queue = list(range(total))
    lock = threading.Lock()
    records, errors = [], []

    def client():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            try:
                rec = one_request(port, prompts[(offset + i) % len(prompts)], max_tokens)
                rec["prompt"] = (offset + i) % len(prompts)
                # The first wave arrives at once; later requests arrive as earlier ones end.
                rec["first_wave"] = i < clients
                with lock:
                    records.append(rec)
            except Exception as e:  # noqa: BLE001 - reported
                with lock:
                    errors.append(str(e))

    start = time.time()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - start
    tokens = sum(r["tokens"] for r in records)
    ttft = [r["first"] - r["sent"] for r in records if r["first"]]
    steady = [r["first"] - r["sent"] for r in records if r["first"] and not r["first_wave"]]
    itl = [b - a for r in records for a, b in zip(r["times"], r["times"][1:])]
    return {
        "clients": clients, "requests": len(records), "errors": errors, "wall_s": wall, "tokens": tokens,
        "tokens_per_s": tokens / wall if wall else 0,
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "ttft_steady_p50_s": pct(steady, 50), "ttft_steady_p99_s": pct(steady, 99),
        "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99),
        "records": [{k: v for k, v in r.items() if k != "times"} | {"pieces": len(r["times"])} for r in records],
    }


def prompts_of(name, limit):
    path = DATA / f"{name}_question.jsonl"
    rows = [json.loads(line) for line in open(path)]
    if name == "spec_bench":
        # Spread over its categories: the same number from each, in file order.
        by = {}
        for r in rows:
            by.setdefault(r["category"], []).append(r)
        rows = [r for group in zip(*by.values()) for r in group]
    return [r["turns"][0] for r in rows][:limit]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--engines", default="mdsd,mdsd-b1,llama")
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--sets", default="mt_bench,spec_bench")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=2, help="requests per client at each level (at least 4 in all)")
    ap.add_argument("--context", type=int, default=2048, help="positions per sequence (slot)")
    ap.add_argument("--mdsd", default=str(ROOT / "target" / "release" / "mdsd"))
    ap.add_argument("--mdsd-args", default="", help="more mdsd serve flags, e.g. '--tree chain-4'")
    ap.add_argument("--llama", default="/tmp/peers/llama-cpp-cpu")
    ap.add_argument("--llama-args", default="", help="more llama-server flags")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--target", default=str(CACHE / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--draft", default=str(CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--mdsd-eagle", default="",
                    help="mdsd drafts with this EAGLE head folder (--eagle) instead of --draft; llama-server keeps --draft")
    a = ap.parse_args()
    levels = [int(c) for c in a.clients.split(",")]
    result = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "args": vars(a), "runs": []}
    for engine in a.engines.split(","):
        proc, port, cmd = start_engine(engine, a, max(levels))
        try:
            # Warm-up (first forwards, lazy allocations, auto-tree calibration).
            one_request(port, "Say hello.", 16)
            for s in a.sets.split(","):
                prompts = prompts_of(s, 10_000)
                # Each level asks prompts the levels before did not (no prefix cached by one
                # level helps the next), as far as the set goes.
                offset = 0
                for c in levels:
                    total = max(4, a.requests * c)
                    level = run_level(port, prompts, c, total, a.max_tokens, offset)
                    offset += total
                    level.update({"engine": engine, "set": s, "command": cmd})
                    result["runs"].append(level)
                    print(f"{engine:8} {s:10} {c:2} clients: {level['tokens_per_s']:7.1f} tok/s, TTFT p50 "
                          f"{level['ttft_p50_s'] or 0:.2f} s p99 {level['ttft_p99_s'] or 0:.2f} s, ITL p50 "
                          f"{1e3 * (level['itl_p50_s'] or 0):.0f} ms p99 {1e3 * (level['itl_p99_s'] or 0):.0f} ms"
                          f"{', ERRORS ' + str(len(level['errors'])) if level['errors'] else ''}", flush=True)
                    json.dump(result, open(a.out, "w"), indent=1)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print("\n| engine | set | clients | tokens/s | x 1 client | TTFT p50 | TTFT p99 | TTFT p99 after the first wave | ITL p50 | ITL p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in result["runs"]:
        one = next(x for x in result["runs"] if x["engine"] == r["engine"] and x["set"] == r["set"] and x["clients"] == levels[0])
        print(f"| {r['engine']} | {r['set']} | {r['clients']} | {r['tokens_per_s']:.1f} | "
              f"{r['tokens_per_s'] / one['tokens_per_s']:.2f} | {r['ttft_p50_s'] or 0:.2f} s | {r['ttft_p99_s'] or 0:.2f} s | "
              f"{'%.2f s' % r['ttft_steady_p99_s'] if r['ttft_steady_p99_s'] is not None else '-'} | "
              f"{1e3 * (r['itl_p50_s'] or 0):.0f} ms | {1e3 * (r['itl_p99_s'] or 0):.0f} ms |")
    json.dump(result, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
