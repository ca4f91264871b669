#!/usr/bin/env python3
"""CTranslate2 peer of the benchmark harness: a worker (bench/peer_worker.py protocol) running
ctranslate2.Encoder on the model converted by bench/export_ct2.py (Hugging Face BertModel, float32
weights), then sentence-transformers' mean pooling and L2 normalisation in numpy (inside the
timed run: the pooled embedding is what every engine of the harness returns).

  --compute-type float32  as converted
  --compute-type int8     weights quantised to int8 by CTranslate2 at load (per output row),
                          activations quantised at run time; the rest float32

The encoder takes the token ids as variable-length lists (it pads and masks itself). One
replica, --threads intra-op threads. Runs in .venv-bench (ctranslate2 is pinned in
bench/requirements.txt; it needs numpy but not numpy 2).

  .venv-bench/bin/python bench/peer_ct2.py --model-dir .cache/bench/ct2 --compute-type int8
"""
import argparse

import ctranslate2
import numpy as np

from peer_worker import Worker, protocol_stream


class Ct2Worker(Worker):
    def __init__(self, model_dir, compute_type, threads):
        self.encoder = ctranslate2.Encoder(model_dir, device="cpu", compute_type=compute_type,
                                           inter_threads=1, intra_threads=threads)
        self.inputs = {}
        self.info = {"engine": f"ctranslate2-{compute_type}",
                     "ctranslate2": ctranslate2.__version__,
                     "compute_type": self.encoder.compute_type, "threads": threads,
                     "model": model_dir}

    def prepare(self, workloads):
        self.inputs = {}
        for name, spec in workloads.items():
            if "sequences" not in spec:
                continue
            sequences = [list(s) for s in spec["sequences"]]
            lengths = np.asarray([len(s) for s in sequences])
            mask = (np.arange(lengths.max())[None, :] < lengths[:, None]).astype(np.float32)
            self.inputs[name] = (sequences, mask[:, :, None], lengths[:, None].astype(np.float32))

    def run(self, name):
        sequences, mask, lengths = self.inputs[name]
        hidden = np.asarray(self.encoder.forward_batch(sequences).last_hidden_state)  # (B, T, H)
        pooled = (hidden * mask).sum(1) / lengths                                      # (B, H)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def embed(self, name):
        return self.run(name).astype(np.float32).tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="bench/export_ct2.py's output")
    parser.add_argument("--compute-type", choices=["float32", "int8"], default="float32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = protocol_stream()
    Ct2Worker(args.model_dir, args.compute_type, args.threads).serve(out)


if __name__ == "__main__":
    main()
