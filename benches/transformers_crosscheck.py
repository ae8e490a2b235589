#!/usr/bin/env python3
"""Checkpoint configurations against transformers' own implementation: rotary scaling
(linear, llama3, YaRN), transformers v5's `rope_parameters` spelling, LLaMA's biases.

Two uses:

  python benches/transformers_crosscheck.py --print-frequencies > crates/engine/src/model/rope_scaling_reference.rs
      Writes the inverse frequencies and attention factors that transformers computes
      (`ROPE_INIT_FUNCTIONS`) for the configurations in CASES, as the Rust fixture that
      `engine::model::rope_scaling`'s unit test compares with.

  python benches/transformers_crosscheck.py --models DIR
      Builds tiny random LLaMA, Qwen2 and Qwen3 models with transformers, one per
      configuration below, saves each with `save_pretrained` (so `config.json` is in transformers'
      own current spelling) under DIR/NAME, and writes the logits of a fixed 200-token prompt
      (float32, eager attention) to DIR/NAME/expected.json. Then
          MDSD_TRANSFORMERS_REFERENCE=DIR cargo test --release -p engine --test it -- --ignored checkpoint_configs::
      loads each folder with mdsd's loader and compares its logits (1e-4).

  python benches/transformers_crosscheck.py --models DIR --gguf LLAMA_CPP_DIR
      Also converts each model to DIR/NAME/model.gguf (f32) with llama.cpp's own
      convert_hf_to_gguf.py (LLAMA_CPP_DIR: e.g. vendor/llama.cpp of the llama-cpp-python sdist,
      `curl` it from PyPI); the same test then loads the GGUF files too.

Needs torch and transformers (`pip install torch transformers`); nothing here runs in CI.
"""

import argparse
import copy
import json
import os
import sys

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# (description, config.json fields, head_dim). Real checkpoints' values where named.
CASES = [
    ("LLaMA-3.1-8B", {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
                      "rope_theta": 500000.0,
                      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    ("LLaMA-3.2-1B (head_dim 64), v5 spelling", {
        "hidden_size": 2048, "num_attention_heads": 32, "head_dim": 64, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    ("Qwen2.5-7B with the model card's YaRN", {
        "hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}),
    ("YaRN with mscale, mscale_all_dim, betas, no truncation", {
        "hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 32768, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                         "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 16.0, "beta_slow": 2.0,
                         "truncate": False}}),
    ("YaRN with an explicit attention factor", {
        "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 8192, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096,
                         "attention_factor": 1.25}}),
    ("linear", {"hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 8192, "rope_theta": 10000.0,
                "rope_scaling": {"type": "linear", "factor": 2.0}}),
    ("tiny llama3 (the engine tests' shape)", {
        "hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 256, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}}),
    ("tiny YaRN", {
        "hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 256, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}),
]


def frequencies(fields):
    config = LlamaConfig(**copy.deepcopy(fields))  # transformers adds keys to the dicts it is given
    kind = config.rope_parameters.get("rope_type", "default")
    inv_freq, attention = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.tolist(), float(attention)


def print_frequencies():
    print("// Written by `python benches/transformers_crosscheck.py --print-frequencies` with transformers "
          f"{__import__('transformers').__version__} and torch {torch.__version__}; do not edit.")
    print("#[allow(clippy::excessive_precision)] // the f64 values of transformers' f32 frequencies")
    print("fn reference_cases() -> Vec<(Value, usize, Vec<f32>, f32)> {")
    print("    vec![")
    for name, fields in CASES:
        inv_freq, attention = frequencies(fields)
        head_dim = fields.get("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
        values = ", ".join(repr(float(torch.tensor(x, dtype=torch.float32))) for x in inv_freq)
        print(f"        // {name}")
        print(f"        (json!({json.dumps(fields)}), {head_dim}, vec![{values}], {attention!r}),")
    print("    ]")
    print("}")


# Tiny models: (name, architecture, config fields). The prompt reaches position 199, past every
# original context here, so each scaling changes the logits.
MODELS = [
    ("llama-default", "llama", {"rope_theta": 10000.0}),
    ("llama-theta", "llama", {"rope_theta": 1000000.0}),
    ("llama-llama3", "llama", {"rope_theta": 500000.0,
                               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    ("llama-linear", "llama", {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 3.0}}),
    ("qwen2-yarn", "qwen2", {"rope_theta": 1000000.0,
                             "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64}}),
    ("qwen2-yarn-mscale", "qwen2", {"rope_theta": 10000.0,
                                    "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                                     "original_max_position_embeddings": 32, "mscale": 1.0,
                                                     "mscale_all_dim": 0.5, "beta_fast": 8.0, "beta_slow": 2.0}}),
    ("llama-biases", "llama", {"rope_theta": 10000.0, "attention_bias": True, "mlp_bias": True}),
    ("qwen3", "qwen3", {"rope_theta": 1000000.0, "head_dim": 32}),
    ("qwen3-yarn", "qwen3", {"rope_theta": 1000000.0, "head_dim": 32,
                             "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64}}),
]


def build_models(out):
    os.makedirs(out, exist_ok=True)
    prompt = [(i * 37 + 11) % 96 for i in range(200)]
    for seed, (name, arch, rope) in enumerate(MODELS):
        torch.manual_seed(1000 + seed)
        rope = copy.deepcopy(rope)
        common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rms_norm_eps=1e-6, initializer_range=0.2, tie_word_embeddings=False, **rope)
        if arch == "llama":
            model = LlamaForCausalLM(LlamaConfig(**common, attn_implementation="eager"))
        elif arch == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**common, attn_implementation="eager"))
        else:
            model = Qwen3ForCausalLM(Qwen3Config(**common, attn_implementation="eager"))
        model = model.float().eval()
        with torch.no_grad():  # transformers initialises biases to zero; give them values
            for pname, param in model.named_parameters():
                if pname.endswith(".bias"):
                    param.normal_(0.0, 0.2)
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0]
        folder = os.path.join(out, name)
        model.save_pretrained(folder, safe_serialization=True)
        with open(os.path.join(folder, "expected.json"), "w") as f:
            json.dump({"prompt": prompt, "logits": logits.tolist()}, f)
        with open(os.path.join(folder, "config.json")) as f:
            keys = sorted(k for k in json.load(f) if "rope" in k)
        print(f"{name}: config.json rope keys {keys}, logits {tuple(logits.shape)}", file=sys.stderr)


def add_tokenizer(folder, vocab):
    """A byte-level BPE tokenizer of `vocab` single characters (no merges), saved as transformers
    saves one: what llama.cpp's converter needs beside the weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    # The last id is `<|endoftext|>`, which Qwen's tokenizer classes add when it is missing.
    chars = sorted(pre_tokenizers.ByteLevel.alphabet())[:vocab - 1] + ["<|endoftext|>"]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)


def convert_to_gguf(out, converter):
    """Converts every model under `out` to `model.gguf` (f32) with llama.cpp's own
    `convert_hf_to_gguf.py` (the directory holding it, with `conversion/` and `gguf-py/`, e.g.
    `vendor/llama.cpp` of the llama-cpp-python sdist). Its tokenizer fingerprint does not know
    our tiny tokenizer, so it is told the pre-tokenizer (`default`)."""
    import runpy
    sys.path[:0] = [converter, os.path.join(converter, "gguf-py")]
    import conversion.base
    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    for name, _, _ in MODELS:
        folder = os.path.join(out, name)
        add_tokenizer(folder, 96)
        sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", os.path.join(folder, "model.gguf"),
                    "--outtype", "f32"]
        runpy.run_path(os.path.join(converter, "convert_hf_to_gguf.py"), run_name="__main__")
        print(f"{name}: model.gguf written by llama.cpp's converter", file=sys.stderr)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--print-frequencies", action="store_true")
    p.add_argument("--models", metavar="DIR")
    p.add_argument("--gguf", metavar="LLAMA_CPP_DIR",
                   help="with --models: also convert each model with llama.cpp's convert_hf_to_gguf.py in this directory")
    a = p.parse_args()
    if a.print_frequencies:
        print_frequencies()
    if a.models:
        build_models(a.models)
        if a.gguf:
            convert_to_gguf(a.models, a.gguf)
    if not (a.print_frequencies or a.models):
        p.error("give --print-frequencies or --models DIR")
