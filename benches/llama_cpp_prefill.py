#!/usr/bin/env python3
"""Seconds for llama.cpp (through llama-cpp-python) to prefill a prompt of N tokens, to set
beside the `prefill_s` of `mdsd generate --no-spec --max-new-tokens 1 --json` on the same
GGUF file and the same token count.

    pip install llama-cpp-python==0.3.36      # builds llama.cpp from source
    python3 benches/llama_cpp_prefill.py MODEL.gguf --tokens 1299 [--threads 2] [--reps 2]

The tokens are ids 100, 101, ... (their values do not change the cost); only the last row's
logits are computed, as in a prompt's prefill. The best of `--reps` runs is printed.
"""
import argparse
import time

from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    a = ap.parse_args()
    llm = Llama(a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.tokens + 16,
                n_batch=a.batch, logits_all=False, verbose=False)
    toks = [100 + i for i in range(a.tokens)]
    best = float("inf")
    for _ in range(a.reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        best = min(best, time.perf_counter() - t0)
    print(f"llama.cpp {a.threads} threads, n_batch {a.batch}: {a.tokens} tokens in {best:.2f} s "
          f"({a.tokens / best:.1f} tokens/s)")


if __name__ == "__main__":
    main()
