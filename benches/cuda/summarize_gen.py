"""Markdown table of gpu_checks.sh's gen.jsonl: per dtype and temperature, tau, tokens/s,
speed against no-spec of the same dtype and temperature, and (at temperature 0) whether the
text equals the no-spec text."""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["dtype"], r["temperature"]): r["result"] for r in rows if r["method"] == "no-spec"}
print("| dtype | T | method | tree | draft | tau | rows/forward | tokens/s | vs no-spec | text = no-spec |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    res, b = r["result"], base.get((r["dtype"], r["temperature"]))
    if res is None:
        print(f"| {r['dtype']} | {r['temperature']} | {r['method']} | {r.get('tree', '')} | {r.get('draft', '')} | failed | | | | |")
        continue
    ratio = res["tokens_per_s"] / b["tokens_per_s"] if b else float("nan")
    same = ""
    if r["temperature"] == 0 and r["method"] != "no-spec" and b:
        same = "yes" if res["text"] == b["text"] else "**no**"
    rows_per = res["target_rows"] / max(res["target_forwards"], 1)
    print(
        f"| {r['dtype']} | {r['temperature']} | {r['method']} | {r.get('tree', '')} | {r.get('draft', '')} "
        f"| {res['tau']:.2f} | {rows_per:.1f} | {res['tokens_per_s']:.1f} | {ratio:.2f}x | {same} |"
    )
