#!/usr/bin/env python3
"""A head that `mdsd train-eagle` wrote, run by EAGLE's own code: loads the head into EAGLE's
EAGLE-1 draft model (`eagle/model/cnets1.py`'s `Model`, as `EaModel.from_pretrained(...,
use_eagle3=False)` builds it) and scores it on a stored feature folder (the held-out MT-Bench
answers, `eval_features/`) as `train-eagle`'s evaluation does, so that the figures can be set
beside the training log's.

What it checks:
  1. The head's weights load into EAGLE's model by their names: none of the file's names is
     unknown to it (EAGLE loads non-strictly, so an unknown name would be dropped silently), and
     the only weight of EAGLE's model the file lacks is `embed_tokens.weight` (the target's
     embedding, which EAGLE takes from the base model).
  2. EAGLE's forward gives the head's figures: on every answer entry `j` of every stored text,
     the head reads the target's feature `f_j` and the next token `x_{j+1}`; its output `g_j`
     is scored against `f_{j+1}` (SmoothL1, `regression`), its most probable token over the
     output layer's first `--draft-vocab` ids against the target's over the same ids (`acc`) and
     over the whole vocabulary (`acc_full`, the top-1 accuracy), and the soft cross entropy
     against the target's distribution over the cut (`token`).

Usage:
  python3 benches/eagle_reference.py --eagle-src EAGLE/ --head RUN/head --features RUN/eval_features \
      --target ~/.cache/mdsd/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--log RUN/train_log.jsonl] [--out F.json]

EAGLE/ is a checkout of https://github.com/SafeAILab/EAGLE (its `eagle/model` package is
imported from it). Needs torch, transformers, safetensors, numpy and gguf (all from PyPI). The
target's embedding and output layer are dequantized from the GGUF with `gguf`'s own
dequantizers; mdsd's kernels quantize the activations to 8 bits in the target's output layer
(its logits over the cut as well as over the whole vocabulary), so `acc`, `acc_full` and
`token` may differ from mdsd's by that rounding (a few entries in ten thousand on near ties).
"""
import argparse, json, sys, time
from pathlib import Path

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eagle-src", required=True, help="a checkout of SafeAILab/EAGLE")
    ap.add_argument("--head", required=True, help="the head's folder (config.json + model.safetensors)")
    ap.add_argument("--features", required=True, help="a feature folder (hidden.f16 + sequences.jsonl)")
    ap.add_argument("--target", required=True, help="the target's GGUF file")
    ap.add_argument("--draft-vocab", type=int, default=32768, help="the cut, as train-eagle's (0: the whole vocabulary)")
    ap.add_argument("--log", help="the run's train_log.jsonl: its last `eval` scores are printed beside")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the figures here (JSON)")
    a = ap.parse_args()

    import torch
    import gguf
    from safetensors.torch import load_file

    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(Path(a.eagle_src).resolve()))
    from eagle.model.cnets1 import Model
    from eagle.model.configs import EConfig

    # 1. EAGLE's model, built as EaModel builds it (without the base model's embedding).
    head = Path(a.head)
    config = EConfig.from_pretrained(str(head / "config.json"))
    bias = json.loads((head / "config.json").read_text()).get("bias", True)
    model = Model(config, bias=bias, load_emb=False)
    state = load_file(str(head / "model.safetensors"))
    loaded = model.load_state_dict(state, strict=False)
    missing, unexpected = sorted(loaded.missing_keys), sorted(loaded.unexpected_keys)
    print(f"weights: {len(state)} in the file; EAGLE's model lacks none of them: {not unexpected}; "
          f"of its own, the file lacks {missing}")
    if unexpected or missing != ["embed_tokens.weight"]:
        sys.exit(f"the head's names do not match EAGLE's model: unknown {unexpected}, missing {missing}")
    model = model.float().eval()

    # The target's embedding and output layer, dequantized from the GGUF.
    reader = gguf.GGUFReader(a.target)
    tensors = {t.name: t for t in reader.tensors}

    def dense(name):
        t = tensors[name]
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))

    emb = dense("token_embd.weight")
    out_w = dense("output.weight") if "output.weight" in tensors else emb
    with torch.no_grad():
        model.embed_tokens.weight.copy_(emb[: model.embed_tokens.weight.shape[0]])
    cut = out_w if a.draft_vocab <= 0 else out_w[: a.draft_vocab]
    print(f"target: embedding {tuple(emb.shape)}, output layer {tuple(out_w.shape)} "
          f"({'output.weight' if 'output.weight' in tensors else 'tied to the embedding'}), cut to {cut.shape[0]}")

    # 2. Every stored text's answer entries through EAGLE's forward.
    feats = Path(a.features)
    seqs = [json.loads(l) for l in (feats / "sequences.jsonl").read_text().splitlines() if l.strip()]
    h = config.hidden_size
    hidden = np.memmap(feats / "hidden.f16", dtype=np.float16, mode="r").reshape(-1, h)
    sums = dict(regression=0.0, token=0.0, acc=0, acc_full=0, rows=0)
    start = time.time()
    with torch.no_grad():
        for s in seqs:
            tokens, first, L = s["tokens"], s["first_row"], len(s["tokens"])
            n = L - 1
            frm = min(max(s["answer_start"] - 1, 0), max(n - 1, 0))
            if n == 0:
                continue
            f = torch.from_numpy(np.asarray(hidden[first : first + L], dtype=np.float32))
            ids = torch.tensor(tokens[1 : n + 1], dtype=torch.long)[None]
            g = model(f[None, :n], ids)[0, frm:n]
            nxt = f[frm + 1 : n + 1]
            d = (g - nxt).abs()
            sums["regression"] += torch.where(d < 1, 0.5 * d * d, d - 0.5).mean(-1).sum().item()
            q = g @ cut.T
            t_cut = nxt @ cut.T
            p = torch.softmax(t_cut, -1)
            sums["token"] += -(p * torch.log_softmax(q, -1)).sum(-1).sum().item()
            top = q.argmax(-1)
            sums["acc"] += (top == t_cut.argmax(-1)).sum().item()
            sums["acc_full"] += (top == (nxt @ out_w.T).argmax(-1)).sum().item()
            sums["rows"] += n - frm
    rows = max(sums["rows"], 1)
    scores = {k: sums[k] / rows for k in ("regression", "token", "acc", "acc_full")}
    scores["rows"] = sums["rows"]
    print(f"EAGLE's code on {len(seqs)} texts ({sums['rows']} answer entries, {time.time() - start:.0f} s): "
          + ", ".join(f"{k} {v:.4f}" for k, v in scores.items() if k != "rows"))
    result = {"head": str(head), "features": str(feats), "eagle_reference": scores,
              "missing": missing, "unexpected": unexpected}
    if a.log:
        evals = [json.loads(l) for l in Path(a.log).read_text().splitlines() if '"event":"eval"' in l]
        last = [e for e in evals if e.get("split") == "eval"][-1]["scores"]
        print("train-eagle's log (last eval, the f32 weights before the f16 file): "
              + ", ".join(f"{k} {last[k]:.4f}" for k in ("regression", "token", "acc", "acc_full")) + f", rows {last['rows']}")
        result["train_log"] = last
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
