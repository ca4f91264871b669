#!/usr/bin/env python3
"""Times one fine-tuning step of HF BertModel (PyTorch eager, fp32), as attn-bench-train does.

The step: forward of --pairs anchors and --pairs positives (one forward over 2 x pairs
sequences), mean pooling + F.normalize, MultipleNegativesRankingLoss (cross-entropy over
scale 20 x cosine, in-batch negatives), backward, clip_grad_norm_(1.0), AdamW (lr 2e-5,
eps 1e-6, weight decay 0.01, no decay for biases and LayerNorm) over every parameter, then
zero_grad. Dropout off. Every sequence is exactly --seq-len tokens: [CLS] + random
in-vocabulary ids (fixed seed) + [SEP]. Median of --runs after --warmup; prints one JSON line
with the fields attn-bench-train prints, so the two can be interleaved in one run.

Run with the golden venv (tests/golden/setup_venv.sh):
  OPENBLAS_CORETYPE=SkylakeX .venv-golden/bin/python bench/peer_torch_train.py --threads 2
For fair numbers Debian's torch needs OpenBLAS (libopenblas0-openmp) instead of the reference
BLAS; see ../shared/DESIGN.md "Performance peers".
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModel

MNRL_SCALE = 20.0


def mean_pool(hidden, mask):
    """Sentence-transformers' mean pooling: sum of token states over the mask / token count."""
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def param_groups(model, weight_decay):
    """Sentence-transformers' two groups: no decay for biases and LayerNorm weights."""
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not any(nd in n for nd in no_decay)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    # No pooler (dense + tanh on [CLS]): MNRL with mean pooling never uses it, and attnserve
    # has none. transformers logs the checkpoint's unused pooler.* weights; that is expected.
    transformers.logging.set_verbosity_error()
    model = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager",
                                      add_pooling_layer=False, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
    model.train()  # dropout probabilities are 0, so train mode is deterministic
    for p in model.parameters():
        p.requires_grad_(True)  # all parameters trainable
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=2e-5, eps=1e-6)

    # Anchors are rows [0, pairs), positives rows [pairs, 2 * pairs): one forward for both
    # (sentence-transformers runs one per column; same work, fewer small launches).
    generator = torch.Generator().manual_seed(42)
    ids = torch.randint(1000, model.config.vocab_size, (2 * args.pairs, args.seq_len),
                        generator=generator)
    ids[:, 0] = 101   # [CLS]
    ids[:, -1] = 102  # [SEP]
    mask = torch.ones_like(ids)
    labels = torch.arange(args.pairs)

    def step():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state  # (2N, T, H)
        embeddings = F.normalize(mean_pool(hidden, mask), p=2, dim=1)         # (2N, H)
        anchors, positives = embeddings[:args.pairs], embeddings[args.pairs:]
        scores = MNRL_SCALE * anchors @ positives.t()  # (N, N), cos of unit vectors
        loss = F.cross_entropy(scores, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        return loss.item()

    times = []
    loss = float("nan")
    for i in range(args.warmup + args.runs):
        start = time.perf_counter()
        loss = step()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"engine": f"pytorch-{torch.__version__}-train", "pairs": args.pairs,
                      "seq_len": args.seq_len, "threads": args.threads,
                      "median_ms": round(median * 1e3, 2), "min_ms": round(min(times) * 1e3, 2),
                      "examples_per_s": round(args.pairs / median, 1),
                      "final_loss": round(loss, 6)}))


if __name__ == "__main__":
    main()
