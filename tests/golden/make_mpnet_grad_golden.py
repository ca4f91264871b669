#!/usr/bin/env python3
"""Generate the MPNet gradient-parity fixture (torch autograd on all-mpnet-base-v2).

Reference: Hugging Face MPNetModel (models/all-mpnet-base-v2), float32, train() mode with every
dropout probability 0, eager attention. Two token sequences (a short sentence and a paragraph
truncated to 140 tokens, so relative distances reach past 128) each run ALONE (batch 1, no
padding, mask all ones); the loss is

    loss = sum over both sequences of sum(last_hidden_state * R_s)

with R_s a fixed standard-normal matrix (numpy default_rng(SEED)), stored. Gradients of both
runs accumulate in .grad, so they are what one packed engine batch of the two sequences gives.

Output (read by tests/golden/mpnet_grad_parity_test.cc):
  tests/golden/mpnet_grad_cases.json       texts, ids, loss, parameter list with storage kind
  tests/golden/mpnet_grad_golden.safetensors
      r.<i>              F32 [T_i, 768]  R for sequence i
      grad.<p>           F32 shape(p)    numel(p) <= 4096 ("full")
      grad_idx.<p>       I64 [512]       flat indices, sorted (numel(p) > 4096, "sampled")
      grad_val.<p>       F32 [512]       gradient values there
  <p> is the HF name without "mpnet." (pooler.* is not on the loss's path and is skipped).

Run (never by CI): .venv-golden/bin/python tests/golden/make_mpnet_grad_golden.py
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import safetensors.numpy  # noqa: E402
import torch  # noqa: E402
from golden_common import library_versions, sha256_file  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SEED = 17
SAMPLES = 512
FULL_LIMIT = 4096

TEXTS = [
    ("The king spoke to the queen about the harvest.", 512),
    ("".join("Paragraph %d. The committee reviewed the quarterly report on river levels, noting "
             "that rainfall in the northern valleys had exceeded the long-term average. " % i
             for i in range(1, 10)), 140),
]


def main():
    model_dir = os.path.join(REPO, "models", "all-mpnet-base-v2")
    tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32,
                                      attn_implementation="eager",
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.train()
    rng = np.random.default_rng(SEED)
    tensors, sequences = {}, []
    total = 0.0
    model.zero_grad()
    for i, (text, max_length) in enumerate(TEXTS):
        ids = tok(text, truncation=True, max_length=max_length)["input_ids"]
        r = rng.standard_normal((len(ids), model.config.hidden_size)).astype(np.float32)
        input_ids = torch.tensor([ids])
        out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
        loss = (out.last_hidden_state[0] * torch.from_numpy(r)).sum()
        loss.backward()
        total += float(loss.detach())
        tensors[f"r.{i}"] = r
        sequences.append({"text": text, "max_length": max_length, "input_ids": ids})
        print(f"sequence {i}: {len(ids)} tokens, loss {float(loss):.6f}", file=sys.stderr)
    assert len(sequences[1]["input_ids"]) == 140

    params = []
    for name, p in model.named_parameters():
        if name.startswith("pooler."):
            assert p.grad is None
            continue
        g = p.grad.detach().numpy().astype(np.float32)
        entry = {"name": name, "shape": list(p.shape),
                 "grad_norm": float(np.linalg.norm(g.astype(np.float64)))}
        if g.size <= FULL_LIMIT:
            tensors[f"grad.{name}"] = np.ascontiguousarray(g)
            entry["storage"] = "full"
        else:
            idx = np.sort(rng.choice(g.size, SAMPLES, replace=False)).astype(np.int64)
            tensors[f"grad_idx.{name}"] = idx
            tensors[f"grad_val.{name}"] = np.ascontiguousarray(g.reshape(-1)[idx])
            entry["storage"] = "sampled"
        params.append(entry)

    doc = {"model": "all-mpnet-base-v2",
           "model_sha256": sha256_file(os.path.join(model_dir, "model.safetensors")),
           "versions": library_versions(), "seed": SEED, "loss": total,
           "sequences": sequences, "parameters": params}
    json_path = os.path.join(HERE, "mpnet_grad_cases.json")
    st_path = os.path.join(HERE, "mpnet_grad_golden.safetensors")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    safetensors.numpy.save_file(tensors, st_path,
                                metadata={"generator": "tests/golden/make_mpnet_grad_golden.py"})
    print(f"{len(params)} parameters; {os.path.getsize(st_path)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
