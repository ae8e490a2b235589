#!/usr/bin/env python3
"""End to end against llama.cpp: MT-Bench first turns, greedy (temperature 0) or plain
temperature sampling (`--temperature T`, llama.cpp's top-k, top-p and min-p turned off), the same
GGUF files and threads, every engine and mode run on a question before the next question.

llama.cpp is built from the source that the llama-cpp-python sdist vendors (no other source is
reachable here):

    # the sdist from PyPI: `pip download -vvv --no-deps --no-binary :all: llama-cpp-python==0.3.36`
    # prints its files.pythonhosted.org URL; fetch llama_cpp_python-0.3.36.tar.gz from it with curl
    pip install cmake ninja
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    ninja -C build llama-completion llama-speculative-simple

    python3 benches/llama_cpp_e2e.py --llama-bin .../build/bin --limit 10 \\
        --name e2e-llama-cpp-qwen-cpu

Modes, each a fresh process per question (model loading is outside every rate):
- `llama.cpp plain`: `llama-completion`; its rate is "eval time" (decode, sampling excluded).
- `llama.cpp spec N`: `llama-speculative-simple` with the draft model and `--spec-draft-n-max N`
  (a chain of up to N drafts, the draft's most probable tokens, accepted while they equal the
  token the target samples: exact at any temperature); its rate is
  "decoded ... tokens in ... s".
- `mdsd plain`: `mdsd generate --no-spec`; `mdsd`: `mdsd generate` with its defaults (`--tree
  auto`, `--ngram first`); the rate is `tokens_per_s` of `--json` (decode; `auto`'s cost
  measurements are in the prefill).

The prompt is the Qwen2.5 chat template with its default system turn, rendered here for
llama.cpp and by `mdsd --chat` for mdsd; the script refuses to go on unless both count the same
prompt tokens. Writes NAME.records.jsonl (one line per run) and NAME.md (the table).
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
CACHE = Path.home() / ".cache" / "mdsd"


def render(question):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def run(cmd, timeout):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p, time.perf_counter() - t0


def number(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        sys.exit(f"no {what} in the output:\n{text[-3000:]}")
    return m.groups()


def llama_plain(a, prompt):
    cmd = [str(a.llama_bin / "llama-completion"), "-m", str(a.target), "-p", prompt,
           "-n", str(a.max_new_tokens), "-t", str(a.threads), "-tb", str(a.threads),
           "-c", "4096", "-no-cnv", "--no-display-prompt"] + llama_sampling(a)
    p, wall = run(cmd, a.timeout)
    log = p.stdout + p.stderr
    prompt_ms, prompt_tokens = number(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", log, "prompt eval")
    eval_ms, runs = number(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", log, "eval time")
    (sampling_ms,) = number(r"sampling time =\s*([\d.]+) ms", log, "sampling time")
    return {"prompt_tokens": int(prompt_tokens), "new_tokens": int(runs) + 1, "sampling_ms": float(sampling_ms),
            "tokens_per_s": int(runs) / (float(eval_ms) / 1e3), "text": p.stdout, "wall_s": wall}


def llama_sampling(a):
    """Plain temperature sampling, as `mdsd generate` does by default: llama.cpp's top-k, top-p and
    min-p (on by default there) are turned off; at temperature 0 it is greedy."""
    if a.temperature == 0:
        return ["--temp", "0", "--top-k", "1", "--seed", str(a.seed)]
    return ["--temp", str(a.temperature), "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", str(a.seed)]


def llama_spec(a, prompt, n_max):
    cmd = [str(a.llama_bin / "llama-speculative-simple"), "-m", str(a.target), "-md", str(a.draft),
           "-p", prompt, "-n", str(a.max_new_tokens), "-t", str(a.threads), "-tb", str(a.threads), "-td", str(a.threads), "-tbd", str(a.threads),
           "-c", "4096", "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_max)] + llama_sampling(a)
    p, wall = run(cmd, a.timeout)
    log = p.stdout + p.stderr
    (prompt_tokens,) = number(r"encoded\s+(\d+) tokens", log, "prompt count")
    n, secs = number(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log, "decode rate")
    drafted, accepted = number(r"n_drafted = (\d+)\s+.*?n_accept\s+= (\d+)", log.replace("\n", " "), "drafts")
    return {"prompt_tokens": int(prompt_tokens),
            "new_tokens": int(n), "tokens_per_s": int(n) / float(secs), "drafted": int(drafted),
            "accepted": int(accepted), "text": p.stdout, "wall_s": wall}


def mdsd(a, question, extra):
    cmd = [str(a.mdsd), "generate", "--chat", "--prompt", question, "--temperature", str(a.temperature),
           "--seed", str(a.seed),
           "--max-new-tokens", str(a.max_new_tokens), "--target", str(a.target), "--draft", str(a.draft),
           "--json"] + extra
    p, wall = run(cmd, a.timeout)
    s = json.loads(p.stdout.strip().splitlines()[-1])
    return {"prompt_tokens": s["prompt_tokens"], "new_tokens": s["new_tokens"],
            "tokens_per_s": s["tokens_per_s"], "tau": s["tau"], "text": s["text"], "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", type=Path, required=True, help="llama.cpp's build/bin")
    ap.add_argument("--mdsd", type=Path, default=Path("target/release/mdsd"))
    ap.add_argument("--target", type=Path, default=CACHE / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--draft", type=Path, default=CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--questions", type=Path, default=Path("../shared/data/mt_bench_question.jsonl"))
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft-n-max", default="3,8", help="llama.cpp draft lengths, comma-separated")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--name", default="e2e-llama-cpp-qwen-cpu")
    ap.add_argument("--out", type=Path, default=Path("benches/results"))
    a = ap.parse_args()
    for f in (a.target, a.draft, a.questions, a.mdsd, a.llama_bin / "llama-completion",
              a.llama_bin / "llama-speculative-simple"):
        if not f.exists():
            sys.exit(f"{f}: not found")

    questions = [json.loads(l) for l in a.questions.open() if l.strip()][: a.limit]
    modes = [("llama.cpp plain", lambda q: llama_plain(a, render(q)))]
    for n in [int(x) for x in a.draft_n_max.split(",") if x]:
        modes.append((f"llama.cpp spec {n}", lambda q, n=n: llama_spec(a, render(q), n)))
    modes.append(("mdsd plain", lambda q: mdsd(a, q, ["--no-spec"])))
    modes.append(("mdsd", lambda q: mdsd(a, q, [])))

    a.out.mkdir(parents=True, exist_ok=True)
    records_path = a.out / f"{a.name}.records.jsonl"
    records = []
    with records_path.open("w") as out:
        for i, q in enumerate(questions):
            turn = q["turns"][0]
            # Rotate the order per question so that drift of the machine falls on every mode.
            order = modes[i % len(modes):] + modes[: i % len(modes)]
            counts = {}
            for name, f in order:
                r = f(turn)
                r.update(question_id=q["question_id"], mode=name, order=order.index((name, f)))
                counts[name] = r["prompt_tokens"]
                records.append(r)
                out.write(json.dumps(r) + "\n")
                out.flush()
                print(f"q{q['question_id']} {name:18} {r['new_tokens']:4} tokens {r['tokens_per_s']:6.2f} tokens/s",
                      file=sys.stderr)
            if len(set(counts.values())) != 1:
                sys.exit(f"question {q['question_id']}: prompt token counts differ: {counts}")

    write_table(a, questions, [m for m, _ in modes], records)


def write_table(a, questions, modes, records):
    by = {(r["question_id"], r["mode"]): r for r in records}
    base = "llama.cpp plain"
    lines = [f"# {a.name}", "",
             f"`python3 benches/llama_cpp_e2e.py --limit {a.limit} --max-new-tokens {a.max_new_tokens} "
             f"--threads {a.threads} --temperature {a.temperature} --draft-n-max {a.draft_n_max} --name {a.name}`", "",
             f"Target `{a.target.name}`, draft `{a.draft.name}`; temperature {a.temperature}; "
             f"{len(questions)} MT-Bench first turns.",
             "Decode tokens/s: the mean over questions; ratios: the mean ± standard deviation over",
             f"questions of each question's rate over `{base}`'s on the same question.", "",
             "| mode | tokens/s | x llama.cpp plain | x mdsd plain | new tokens | tau or acceptance |",
             "|---|---|---|---|---|---|"]
    for m in modes:
        rates = [by[(q["question_id"], m)]["tokens_per_s"] for q in questions]
        vs = [by[(q["question_id"], m)]["tokens_per_s"] / by[(q["question_id"], base)]["tokens_per_s"]
              for q in questions]
        vm = [by[(q["question_id"], m)]["tokens_per_s"] / by[(q["question_id"], "mdsd plain")]["tokens_per_s"]
              for q in questions]
        new = sum(by[(q["question_id"], m)]["new_tokens"] for q in questions)
        rs = [by[(q["question_id"], m)] for q in questions]
        if "tau" in rs[0]:
            extra = f"tau {statistics.mean(r['tau'] for r in rs):.2f}"
        elif "drafted" in rs[0]:
            d, acc = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
            extra = f"{acc}/{d} drafts accepted ({acc / max(d, 1):.0%})"
        else:
            extra = "-"
        sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0
        lines.append(f"| {m} | {statistics.mean(rates):.2f} | {statistics.mean(vs):.2f} ± {sd(vs):.2f} | "
                     f"{statistics.mean(vm):.2f} ± {sd(vm):.2f} | {new} | {extra} |")
    md = a.out / f"{a.name}.md"
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
