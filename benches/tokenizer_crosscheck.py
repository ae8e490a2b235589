#!/usr/bin/env python3
"""Our GGUF tokenizers against an independent build of the same file's tokenizer.

Tokenizes every text of the prompt sets in ../shared/data (MT-Bench, Spec-Bench, Alpaca
instructions, inputs and outputs, EAGLE's Alpaca questions, WMT'14 both sides, CNN/DM
articles) plus hand-written edge cases (whitespace runs, digits, CJK, emoji with joiners,
special-token strings, control characters) twice: with `mdsd tokenize --jsonl` and with the
tokenizer that Hugging Face transformers builds from the same GGUF file
(`transformers.integrations.gguf`, its own reading of `tokenizer.ggml.*`). Prints, per
model, the texts, the tokens, and the texts whose ids differ, with the first differences
token by token. Then the chat template: MT-Bench conversations (one user turn, with a system
turn, and two user turns around an answer) rendered by ours (minijinja, through
`mdsd tokenize --jsonl`) and by transformers' `apply_chat_template` (jinja2), as ids.

Needs `pip install transformers gguf tokenizers jinja2` (PyTorch is not needed: only the
tokenizer is read), and the models in the cache (`mdsd fetch`; SmolLM2 comes with the tests).

    python3 benches/tokenizer_crosscheck.py --mdsd target/release/mdsd \\
        ~/.cache/mdsd/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ~/.cache/mdsd/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import collections
import json
import os
import subprocess
import sys

EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n\n", "\t\tx", "a  b   c    d", "   leading", "trailing   ", "x\r\ny",
    "don't I'LL we've They'RE", "123456789012345", "1,234.56", "€100 ¥200 ₹300",
    "日本語のテキスト、中文文本。한국어", "🙂🙃 👨‍👩‍👧‍👦 🏳️‍🌈", "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|>x<|endoftext|>", "<|im_start|<|im_end|>", "\u00a0nbsp\u2009thin", "e\u0301 vs é",
    "ﬁ ligature", "ÀÉÎÕÜ àéîõü ß ẞ", "Ελληνικά Русский עברית العربية",
    "```python\n    def f(x):\n\treturn x**2\n```", "a" * 300, " " * 50 + "x", "\u200b\u200c\u200d",
    "'s 's 'S 'll", "ABC123def456", "x\x00y", "\ufeffbom", "items: \n1. one \n2. two  3 x",
]


# llama.cpp's pre-tokenizers that split each digit off before GPT-2's regex (`llama-vocab.cpp`).
DIGITS_FIRST = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}


def corpus(data):
    texts = []

    def rows(name):
        with open(os.path.join(data, name), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    for name in ["mt_bench_question.jsonl", "spec_bench_question.jsonl", "eagle_alpaca_question.jsonl"]:
        for r in rows(name):
            texts += r["turns"]
    for r in rows("alpaca_sample.jsonl"):
        texts += [r["instruction"], r["input"], r["output"]]
    for r in rows("wmt14_deen_test.jsonl"):
        texts += [r["de"], r["en"]]
    for r in rows("cnndm_frank_test.jsonl"):
        texts.append(r["article"])
    return texts + EDGE_CASES


def reference_tokenizer(path):
    # transformers refuses GGUF files without PyTorch, though the tokenizer needs none of it.
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    gguf_utils.is_torch_available = lambda: True
    parsed = gguf_utils.load_gguf_checkpoint(path, return_tensors=False)
    tokenizer, _ = convert_gguf_tokenizer(parsed["config"]["model_type"], parsed["tokenizer"])
    return tokenizer, parsed["tokenizer"].get("pre_tokenizer_type"), parsed.get("tokenizer_config", {}).get("chat_template")


def conversations(data):
    """Every MT-Bench question as one user turn, with and without a system turn, and as two
    turns with an assistant's answer between them."""
    with open(os.path.join(data, "mt_bench_question.jsonl"), encoding="utf-8") as f:
        turns = [json.loads(line)["turns"] for line in f if line.strip()]
    system = {"role": "system", "content": "You are terse."}
    out = []
    for t in turns:
        user = {"role": "user", "content": t[0]}
        out += [[user], [system, user], [system, user, {"role": "assistant", "content": "Sure:\n1. one\n2. <b>two</b>"},
                                        {"role": "user", "content": t[1]}]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="GGUF files")
    ap.add_argument("--mdsd", default="target/release/mdsd")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "../../shared/data"))
    ap.add_argument("--show", type=int, default=5, help="differing texts to show per model")
    args = ap.parse_args()
    texts = corpus(args.data)
    lines = "".join(json.dumps(t) + "\n" for t in texts)
    for path in args.models:
        run = subprocess.run([args.mdsd, "tokenize", "--target", path, "--jsonl"], input=lines.encode(),
                             capture_output=True, check=True)
        ours = [json.loads(line) for line in run.stdout.decode().splitlines()]
        assert len(ours) == len(texts), (len(ours), len(texts))
        ref, pre, template = reference_tokenizer(path)
        theirs = [ref.encode(t, add_special_tokens=False).ids for t in texts]
        differ = [i for i in range(len(texts)) if ours[i] != theirs[i]]
        same_text = sum(ref.decode(ours[i]) == ref.decode(theirs[i]) for i in differ)
        print(f"{os.path.basename(path)} (tokenizer.ggml.pre `{pre}`): {len(texts)} texts, "
              f"{sum(map(len, ours))} tokens (ours), {len(differ)} differ "
              f"({same_text} of them decode to the same text both ways)")
        kinds = collections.Counter()
        for i in differ:
            a, b = ours[i], theirs[i]
            k = 0
            while a[k] == b[k]:
                k += 1
            kinds[(ref.id_to_token(a[k]), ref.id_to_token(b[k]))] += 1
        for (x, y), n in kinds.most_common():
            print(f"  first difference ours {x!r} vs reference {y!r}: {n} texts")
        for i in differ[: args.show]:
            print(f"  text {i}: {texts[i][:70]!r}")
        if differ and pre in DIGITS_FIRST:
            # transformers has no entry for these `tokenizer.ggml.pre` values and splits with
            # GPT-2's regex before the digits; llama.cpp splits the digits first. The reference's
            # own vocabulary and merges under llama.cpp's order:
            from tokenizers import pre_tokenizers

            ref.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True),
                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
            again = sum(ours[i] != ref.encode(texts[i], add_special_tokens=False).ids for i in range(len(texts)))
            print(f"  the reference with the digits split first (llama.cpp's `{pre}`): {again} differ")
        if template:
            # The chat template: ours rendered by minijinja, the reference by jinja2 through
            # transformers' apply_chat_template, both tokenized (the reference's tokenizer as
            # corrected above where it differed).
            from transformers import PreTrainedTokenizerFast

            convs = conversations(args.data)
            conv_lines = "".join(json.dumps(c) + "\n" for c in convs)
            run = subprocess.run([args.mdsd, "tokenize", "--target", path, "--jsonl"], input=conv_lines.encode(),
                                 capture_output=True, check=True)
            conv_ours = [json.loads(line) for line in run.stdout.decode().splitlines()]
            assert len(conv_ours) == len(convs), (len(conv_ours), len(convs))
            fast = PreTrainedTokenizerFast(tokenizer_object=ref)
            fast.chat_template = template
            rendered = [fast.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in convs]
            differ = sum(o != ref.encode(r, add_special_tokens=False).ids for o, r in zip(conv_ours, rendered))
            print(f"  chat template: {len(convs)} conversations (1, 2 or 4 messages, with and without a system one), "
                  f"{differ} differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
