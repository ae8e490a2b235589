#!/usr/bin/env python3
"""Acceptance of positional drafts: the draft's k best races (what `--reproducible` drafts)
against a hybrid, q's top k-1 tokens plus the race winner among the other tokens, and q's top k.

Usage: python3 benches/positional_hybrid.py DISTRIBUTIONS.safetensors [--temperature 0.7]
       [--every 3] [--samples 4000] [--seed 0]

DISTRIBUTIONS is a file `bench acceptance` caches (`$MDSD_CACHE/acceptance/*.safetensors`):
the target's and the draft's logits on the kept tokens of every response position. At each
position (every `--every`-th), p and q are the softmax of the kept logits at the temperature
(renormalized on the kept tokens), and `--samples` draws of the shared exponential noise
E_i = -ln u_i decide: the target's token is argmin E_i / p_i; a draft set accepts when it holds
that token. Needs numpy.
"""
import argparse, json, struct

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("file")
ap.add_argument("--temperature", type=float, default=0.7)
ap.add_argument("--every", type=int, default=3)
ap.add_argument("--samples", type=int, default=4000)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

with open(a.file, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()


def tensor(name, dtype):
    lo, hi = header[name]["data_offsets"]
    return np.frombuffer(data[lo:hi], dtype=dtype)


target, draft = tensor("target_logits", np.float32), tensor("draft_logits", np.float32)
offsets = tensor("offsets", np.uint32)
rng = np.random.default_rng(a.seed)
ks = (1, 2, 3, 4, 8)
sums = {(k, m): 0.0 for k in ks for m in ("races", "hybrid", "top-k")}
positions = 0
for i in range(0, len(offsets) - 1, a.every):
    lo, hi = offsets[i], offsets[i + 1]

    def softmax(x):
        e = np.exp(x / a.temperature - (x / a.temperature).max())
        return e / e.sum()

    p, q = softmax(target[lo:hi]), softmax(draft[lo:hi])
    e = rng.exponential(size=(a.samples, len(p)))
    with np.errstate(divide="ignore"):
        race_p, race_q = np.where(p > 0, e / p, np.inf), np.where(q > 0, e / q, np.inf)
    winner = race_p.argmin(1)
    order_q = np.argsort(race_q, 1)
    top_q = np.argsort(-q)
    for k in ks:
        sums[(k, "races")] += (order_q[:, :k] == winner[:, None]).any(1).mean()
        head = top_q[: k - 1]
        rest = np.ones(len(p), bool)
        rest[head] = False
        rest_winner = np.where(rest[None, :], race_q, np.inf).argmin(1)
        sums[(k, "hybrid")] += (np.isin(winner, head) | (rest_winner == winner)).mean()
        sums[(k, "top-k")] += p[top_q[:k]].sum()
    positions += 1

print(f"{positions} positions, {a.samples} noise draws each, temperature {a.temperature}")
print("| drafts | races (--reproducible) | top k-1 + race | top k |")
print("|---|---|---|---|")
for k in ks:
    print(f"| {k} | " + " | ".join(f"{100 * sums[(k, m)] / positions:.2f}%" for m in ("races", "hybrid", "top-k")) + " |")
