"""Writes a Qwen2-shaped checkpoint with random weights in the Hugging Face layout
(config.json, model.safetensors, tokenizer.json), for timing and exactness checks on a GPU
machine that cannot reach the hub or carry real weights.

    python3 benches/cuda/random_qwen2.py OUT_DIR [--shape 1.5b|0.5b] [--dtype bf16|f32]

Shapes copy Qwen2.5-1.5B / Qwen2.5-0.5B (vocabulary 151,936, tied embeddings). The tokenizer
is word-level with tokens `t0 .. t151935` (so every id decodes and a prompt is `t1 t2 ...`).
Embeddings are drawn with std 0.1 (not 0.02) so that the logits are peaked enough for
temperature-0 comparisons not to sit on near-ties; the acceptance rates that random
weights give say nothing about real text: only the timings mean something.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

SHAPES = {
    "1.5b": dict(hidden=1536, inter=8960, layers=28, heads=12, kv=2),
    "0.5b": dict(hidden=896, inter=4864, layers=24, heads=14, kv=2),
}
VOCAB = 151936


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="1.5b", choices=SHAPES)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out-std",
        type=float,
        default=0.02,
        help="std of o_proj and down_proj (what each block adds to the residual stream); small "
        "values make the first blocks predict like the whole model, so `--draft-layers N` on the "
        "same folder is a draft that agrees often",
    )
    a = ap.parse_args()
    s = SHAPES[a.shape]
    h, hd = s["hidden"], s["hidden"] // s["heads"]
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g, device=dev) * std).to(dtype).cpu()

    t = {"model.embed_tokens.weight": rnd(VOCAB, h, std=0.1), "model.norm.weight": torch.ones(h, dtype=dtype)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        q, kv = s["heads"] * hd, s["kv"] * hd
        t[p + "self_attn.q_proj.weight"] = rnd(q, h)
        t[p + "self_attn.q_proj.bias"] = rnd(q)
        t[p + "self_attn.k_proj.weight"] = rnd(kv, h)
        t[p + "self_attn.k_proj.bias"] = rnd(kv)
        t[p + "self_attn.v_proj.weight"] = rnd(kv, h)
        t[p + "self_attn.v_proj.bias"] = rnd(kv)
        t[p + "self_attn.o_proj.weight"] = rnd(h, q, std=a.out_std)
        t[p + "mlp.gate_proj.weight"] = rnd(s["inter"], h)
        t[p + "mlp.up_proj.weight"] = rnd(s["inter"], h)
        t[p + "mlp.down_proj.weight"] = rnd(h, s["inter"], std=a.out_std)
        t[p + "input_layernorm.weight"] = torch.ones(h, dtype=dtype)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
    os.makedirs(a.out, exist_ok=True)
    save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": h,
        "intermediate_size": s["inter"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv"],
        "vocab_size": VOCAB,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float32",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(VOCAB)}, "unk_token": "t0"},
    }
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    print(f"{a.out}: Qwen2 {a.shape} shape, {sum(v.numel() for v in t.values())/1e9:.2f}B parameters, {a.dtype}")


if __name__ == "__main__":
    main()
