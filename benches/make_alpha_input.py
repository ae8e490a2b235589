#!/usr/bin/env python3
"""Writes JSON lines of model-like (p, q) pairs for timing `bench alpha`.

Usage: python3 benches/make_alpha_input.py OUT.jsonl [--lines 9] [--vocab 151936] [--seed 0]

Each line: shared Gaussian logits (sd 2.5) plus independent noise (sd 1) for target and
draft, five boosted head tokens, softmax at T = 1, and n cycling through 2, 3, 4.
"""
import argparse, json, math, random

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--lines", type=int, default=9)
ap.add_argument("--vocab", type=int, default=151936)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
random.seed(a.seed)

def softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]

with open(a.out, "w") as f:
    for k in range(a.lines):
        base = [random.gauss(0, 2.5) for _ in range(a.vocab)]
        t = [b + random.gauss(0, 1.0) for b in base]
        d = [b + random.gauss(0, 1.0) for b in base]
        for i in random.sample(range(a.vocab), 5):
            t[i] += 12
            d[i] += 11
        f.write(json.dumps({"p": softmax(t), "q": softmax(d), "n": 2 + k % 3}) + "\n")
