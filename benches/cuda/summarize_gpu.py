#!/usr/bin/env python3
"""gpu-latest.json from a gpu_checks.sh output folder: the commit, device and date; forward
costs in milliseconds per model and row count (eager candle ops and the device kernels);
mdsd's tokens/s per tree from gen.jsonl; llama.cpp's tg128/pp512 and speculative tokens/s;
the EAGLE head's step; host selection per step at T = 0.7 with the warp on the host and on
the device. Missing parts are left out, never invented.

Usage: python3 benches/cuda/summarize_gpu.py OUT > OUT/gpu-latest.json
"""
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ms_by_k(costs, role):
    secs = (costs or {}).get("secs", {}).get(role)
    return {k: round(v * 1e3, 4) for k, v in secs.items()} if secs else None


def main(out):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    gpu = open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else None
    summary = {
        "commit": commit or None,
        "device": gpu,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "forward_ms": {},
    }
    for fused in ("0", "1"):
        c = load(os.path.join(out, f"cost-t15q-fused{fused}.json"))
        label = "device_kernels" if fused == "1" else "candle_ops"
        for role in ("target", "draft"):
            v = ms_by_k(c, role)
            if v:
                summary["forward_ms"].setdefault(label, {})[role] = v
        e = ms_by_k(load(os.path.join(out, f"cost-eagle-fused{fused}.json")), "eagle_head")
        if e:
            summary.setdefault("eagle_step_ms", {})[label] = e
        # The CUDA graph probe: replay ms (with the logits' copy), bit-equality, capture errors.
        for name in (f"graph-t15q-fused{fused}.json", f"graph-eagle-fused{fused}.json"):
            g = load(os.path.join(out, name)) or {}
            for role, secs in g.get("graph_secs", {}).items():
                ms = {k: round(v * 1e3, 4) for k, v in secs.items() if v is not None}
                if ms:
                    summary.setdefault("graph_replay_ms", {}).setdefault(label, {})[role] = ms
                summary.setdefault("graph_equal", {}).setdefault(label, {})[role] = g["graph_equal"][role]
                errors = {k: v for k, v in g.get("graph_errors", {}).get(role, {}).items() if v}
                if errors:
                    summary.setdefault("graph_errors", {}).setdefault(label, {})[role] = errors
    for name, key in (("perthread", "forward_ms_per_thread_stream"), ("apart", "forward_ms_products_apart")):
        c = load(os.path.join(out, f"cost-t15q-{name}.json"))
        for role in ("target", "draft"):
            v = ms_by_k(c, role)
            if v:
                summary.setdefault(key, {})[role] = v
    gen = os.path.join(out, "gen.jsonl")
    if os.path.exists(gen):
        ar, spec = {}, {}
        for line in open(gen):
            r = json.loads(line)
            res = r.get("result")
            if res and (r["label"].endswith("graphs T=0") or r["label"].endswith("fused T=0")):
                kind = "mdsd_graphs_tok_s" if r["label"].endswith("graphs T=0") else "mdsd_fused_tok_s"
                args = r["args"]
                tree = "no-spec" if "--no-spec" in args else re.search(r"--tree (\S+)", args).group(1)
                summary.setdefault(kind, {}).setdefault(r["label"].split()[0], {})[tree] = res.get("tokens_per_s")
                continue
            if res and ("warp-host T=0.7" in r["label"] or "warp-device T=0.7" in r["label"]):
                # Host selection per step at T = 0.7 (row copies, warp, verification:
                # verify_s) and the draft's forward with its warps, per tree.
                side = "device" if "warp-device" in r["label"] else "host"
                args = r["args"]
                tree = "no-spec" if "--no-spec" in args else re.search(r"--tree (\S+)", args).group(1)
                top_p = re.search(r"--top-p (\S+)", args)
                if top_p:
                    tree += f" top-p {top_p.group(1)}"
                steps = max(res.get("target_forwards", 0), 1)
                entry = {"verify_ms_per_step": round(1e3 * res["verify_s"] / steps, 4), "tok_s": res.get("tokens_per_s")}
                if res.get("draft_forwards"):
                    entry["draft_ms_per_forward"] = round(1e3 * res["draft_s"] / res["draft_forwards"], 4)
                summary.setdefault("selection_t07", {}).setdefault(side, {})[tree] = entry
                continue
            if not res or not r["label"].endswith("speed T=0"):
                continue
            model = r["label"].split()[0]
            args = r["args"]
            tree = "no-spec" if "--no-spec" in args else re.search(r"--tree (\S+)", args).group(1)
            rate = res.get("tokens_per_s")
            if tree == "no-spec":
                ar[model] = rate
            else:
                spec.setdefault(model, {})[tree] = rate
        summary["mdsd_ar_tok_s"] = ar
        summary["mdsd_spec_tok_s"] = spec
    bench = load(os.path.join(out, "llama-bench.json"))
    if bench:
        for row in bench:
            if row.get("n_gen", 0) > 0:
                summary["llama_cpp_tg128_tok_s"] = row.get("avg_ts")
            elif row.get("n_prompt", 0) > 0:
                summary["llama_cpp_pp512_tok_s"] = row.get("avg_ts")
    spec_txt = os.path.join(out, "llama-speculative.txt")
    if os.path.exists(spec_txt):
        m = re.search(r"decoded\s+\d+\s+tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", open(spec_txt).read())
        if m:
            summary["llama_cpp_spec_tok_s"] = float(m.group(1))
    json.dump(summary, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
