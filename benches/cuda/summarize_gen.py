"""Markdown table of gpu_checks.sh's gen.jsonl. Rows are grouped by label (model, purpose,
temperature); each row is compared with the `--no-spec` row of its label: tokens/s ratio, and
whether the text is equal (at temperature 0, and under --reproducible at any temperature)."""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {r["label"]: r["result"] for r in rows if "--no-spec" in r["args"].split()}


def flag(args, name):
    a = args.split()
    return a[a.index(name) + 1] if name in a else ""


print(
    "| label | tree | draft | draft sampling | tau | rows/forward | draft ms/forward | target ms/forward "
    "| verify ms/step | tokens/s | vs no-spec | text = no-spec |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
failed = 0
for r in rows:
    if r["label"] == "warm-up":
        continue
    res, b, args = r["result"], base.get(r["label"]), r["args"]
    spec = "--no-spec" not in args.split()
    tree = flag(args, "--tree") if spec else "no-spec"
    draft = flag(args, "--draft").rsplit("/", 1)[-1]
    if flag(args, "--draft-layers"):
        draft += f" (first {flag(args, '--draft-layers')} blocks)"
    if flag(args, "--eagle"):
        draft = "EAGLE " + flag(args, "--eagle").rsplit("/", 1)[-1]
    if flag(args, "--draft-vocab"):
        draft += f", ids < {flag(args, '--draft-vocab')}" if flag(args, "--draft-vocab") != "0" else ", all ids"
    if res is None:
        failed += 1
        print(f"| {r['label']} | {tree} | {draft} | | **failed** | | | | | | | |")
        continue
    ratio = res["tokens_per_s"] / b["tokens_per_s"] if b and b["tokens_per_s"] > 0 else float("nan")
    same = ""
    exact = "exact" in r["label"] or "reproducible" in r["label"] or res["temperature"] == 0
    if spec and b and exact:
        same = "yes" if res["text"] == b["text"] else "**no**"
    rows_per = res["target_rows"] / max(res["target_forwards"], 1)
    per = lambda s, n: f"{1000 * res[s] / res[n]:.2f}" if res.get(n) else ""
    print(
        f"| {r['label']} | {tree} | {draft} | {flag(args, '--draft-sampling') if spec else ''} | {res['tau']:.2f} "
        f"| {rows_per:.1f} | {per('draft_s', 'draft_forwards')} | {per('target_s', 'target_forwards')} "
        f"| {per('verify_s', 'target_forwards')} | {res['tokens_per_s']:.1f} | {ratio:.2f}x | {same} |"
    )
# The warp on the device against the warp on the host (gpu_checks.sh): the same seed and
# logits give the same text (p differs only in the sum's rounding).
pairs = {}
for r in rows:
    for side in ("warp-host", "warp-device"):
        if side in r["label"] and r["result"] is not None:
            pairs.setdefault((r["label"].replace(side, "warp"), r["args"]), {})[side] = r["result"]
if pairs:
    print("\n| warp A/B | args | device rows warped | verify ms/step host → device | text equal |")
    print("|---|---|---|---|---|")
    for (label, args), p in pairs.items():
        if len(p) < 2:
            continue
        h, d = p["warp-host"], p["warp-device"]
        v = lambda x: 1000 * x["verify_s"] / max(x["target_forwards"], 1)
        equal = "yes" if h["text"] == d["text"] else "**no**"
        print(f"| {label} | {args} | {d.get('device_warped_rows', 0)} | {v(h):.3f} → {v(d):.3f} | {equal} |")
if failed:
    print(f"\n{failed} run(s) failed: see errors.txt")
