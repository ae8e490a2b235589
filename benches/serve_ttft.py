#!/usr/bin/env python3
"""Time to first token of `mdsd serve` over MT-Bench conversations, through the OpenAI client.

Usage: python3 benches/serve_ttft.py PORT LABEL [--questions 8] [--max-tokens 128]
       [--data ../shared/data/mt_bench_question.jsonl]

Against a running `mdsd serve --port PORT` (with or without --no-prefix-reuse): each question's
turns are sent as one growing conversation (streamed chat completions at temperature 0); for
every turn, the seconds to the first text and to the end. Writes LABEL.json (with the answers,
to compare runs) and prints the means per turn. Needs `pip install openai`.
"""
import argparse, json, time

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("port")
ap.add_argument("label")
ap.add_argument("--questions", type=int, default=8)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--data", default="../shared/data/mt_bench_question.jsonl")
a = ap.parse_args()

client = OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key="none")
questions = [json.loads(line) for line in open(a.data)][: a.questions]
rows = []
for q in questions:
    messages = []
    for turn, text in enumerate(q["turns"]):
        messages.append({"role": "user", "content": text})
        start, first, pieces = time.time(), None, []
        stream = client.chat.completions.create(
            model="mdsd", messages=messages, max_tokens=a.max_tokens, temperature=0, stream=True
        )
        for chunk in stream:
            piece = chunk.choices[0].delta.content if chunk.choices else None
            if piece:
                first = first if first is not None else time.time() - start
                pieces.append(piece)
        answer = "".join(pieces)
        messages.append({"role": "assistant", "content": answer})
        rows.append({"question": q["question_id"], "turn": turn + 1, "ttft_s": first, "total_s": time.time() - start, "answer": answer})
json.dump(rows, open(f"{a.label}.json", "w"), indent=1)
for turn in sorted({r["turn"] for r in rows}):
    r = [x for x in rows if x["turn"] == turn]
    ttft = [x["ttft_s"] for x in r if x["ttft_s"] is not None]
    print(f"{a.label}: turn {turn}: first token {sum(ttft) / len(ttft):.3f} s (range {min(ttft):.3f}-{max(ttft):.3f}), whole answer {sum(x['total_s'] for x in r) / len(r):.2f} s, {len(r)} answers")
