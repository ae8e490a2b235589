#!/usr/bin/env python3
"""Seconds per forward of k new tokens in llama.cpp (through llama-cpp-python), after a
prefix of 64 tokens (`--prefix`), on the same GGUF files as `bench forward-cost`.

    pip install llama-cpp-python==0.3.36      # builds llama.cpp from source (~5 min, 2 cores)
    python3 benches/llama_cpp_forward.py MODEL.gguf [--threads 2] [--reps 5]

Logits are computed for every new row (`logits_all=True`), which is what verifying a draft
tree needs; the best of `--reps` repetitions is printed, as in our own table.
"""
import argparse
import time

from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ks", default="1,2,4,8,16,32")
    ap.add_argument("--prefix", type=int, default=64)
    a = ap.parse_args()
    llm = Llama(a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.prefix + 512,
                n_batch=512, logits_all=True, verbose=False)
    prefix = [100 + i for i in range(a.prefix)]
    llm.eval(prefix)
    print(f"| model | engine | " + " | ".join(f"k={k}" for k in a.ks.split(",")) + " |")
    cells = []
    for k in [int(x) for x in a.ks.split(",")]:
        toks = [500 + i for i in range(k)]
        best = float("inf")
        for _ in range(a.reps):
            llm.n_tokens = a.prefix  # eval() drops cached positions >= n_tokens first
            t0 = time.perf_counter()
            llm.eval(toks)
            best = min(best, time.perf_counter() - t0)
        cells.append(f"{best:.4f}")
    print(f"| {a.model.split('/')[-1]} | llama.cpp {a.threads} threads | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
