#!/usr/bin/env python3
"""A/B of two `mdsd` binaries on MT-Bench first turns, alternating which runs first.

For each of the first N questions and each mode (`--tree chain-2 --ngram off`, `--no-spec`),
runs `mdsd generate --chat --max-new-tokens 128 --seed Q --json` with both binaries and the
extra sampling flags, and prints per-question records, then per mode the mean tokens/s ratio
B / A with its standard error, the summed verify and draft times, and how many texts agreed.

    python3 benches/ab_generate.py A_BIN B_BIN N [generate flags...]
    python3 benches/ab_generate.py /tmp/mdsd-before target/release/mdsd 8 --temperature 0.7 --top-p 0.9
"""
import json
import statistics
import subprocess
import sys

a_bin, b_bin, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
extra = sys.argv[4:]
bins = {"A": a_bin, "B": b_bin}
questions = [json.loads(l) for l in open("../shared/data/mt_bench_question.jsonl")][:n]
modes = {"chain-2": ["--tree", "chain-2", "--ngram", "off"], "no-spec": ["--no-spec"]}
rows = []
for qi, q in enumerate(questions):
    for mode, flags in modes.items():
        res = {}
        for b in (["A", "B"] if qi % 2 == 0 else ["B", "A"]):
            cmd = [bins[b], "generate", "--chat", "--prompt", q["turns"][0], "--max-new-tokens", "128",
                   "--seed", str(qi), "--json", *flags, *extra]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{' '.join(cmd)}: {out.stderr}")
            res[b] = json.loads(out.stdout)
        row = {"q": q["question_id"], "mode": mode, "same_text": res["A"]["text"] == res["B"]["text"]}
        for b in bins:
            row[b] = {k: res[b][k] for k in ["tokens_per_s", "verify_s", "draft_s", "target_s", "new_tokens", "tau"]}
        row["ratio"] = res["B"]["tokens_per_s"] / res["A"]["tokens_per_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
for mode in modes:
    rs = [r for r in rows if r["mode"] == mode]
    ratios = [r["ratio"] for r in rs]
    se = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
    total = lambda b, k: sum(r[b][k] for r in rs)
    mean = lambda b: statistics.mean(r[b]["tokens_per_s"] for r in rs)
    print(
        f"{mode}: B/A tokens/s {statistics.mean(ratios):.3f} ± {se:.3f} (mean {mean('A'):.2f} -> {mean('B'):.2f}); "
        f"verify_s {total('A', 'verify_s'):.3f} -> {total('B', 'verify_s'):.3f}; "
        f"draft_s {total('A', 'draft_s'):.3f} -> {total('B', 'draft_s'):.3f}; "
        f"same text {sum(r['same_text'] for r in rs)}/{len(rs)}"
    )
