#!/usr/bin/env python3
"""Times Hugging Face BertModel (PyTorch eager, fp32) on the same shape attn-bench-engine uses:
batch x seq_len random in-vocabulary ids with [CLS]/[SEP], median of --runs after --warmup.
Prints one JSON line like attn-bench-engine, so the two can be interleaved in one run.

Run with the golden venv (tests/golden/setup_venv.sh):
  OPENBLAS_CORETYPE=SkylakeX .venv-golden/bin/python bench/peer_torch.py --threads 2
For fair numbers Debian's torch needs OpenBLAS (libopenblas0-openmp) instead of the reference
BLAS; see ../shared/DESIGN.md "Performance peers".
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import AutoModel


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(42)
    ids = torch.randint(1000, model.config.vocab_size, (args.batch, args.seq_len),
                        generator=generator)
    ids[:, 0] = 101   # [CLS]
    ids[:, -1] = 102  # [SEP]
    mask = torch.ones_like(ids)
    times = []
    with torch.no_grad():
        for i in range(args.warmup + args.runs):
            start = time.perf_counter()
            model(input_ids=ids, attention_mask=mask)
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"engine": f"pytorch-{torch.__version__}-eager", "batch": args.batch,
                      "seq_len": args.seq_len, "threads": args.threads,
                      "median_ms": round(median * 1e3, 2), "min_ms": round(min(times) * 1e3, 2),
                      "tokens_per_s": round(args.batch * args.seq_len / median)}))


if __name__ == "__main__":
    main()
