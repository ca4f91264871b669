#!/usr/bin/env python3
"""Converts the model to CTranslate2's format for the CTranslate2 peer of the benchmark harness
(bench/peer_ct2.py), with CTranslate2's own Hugging Face converter (it loads the model with
transformers + torch, which is why this runs in .venv-bench), float32 weights: the int8 rows
quantise them when the encoder loads (compute_type int8).

Checks the conversion before anything is timed: the converted encoder's mean-pooled, normalised
embeddings against PyTorch's on a batch of two different lengths (max |difference| <= 1e-4), and
writes export.json (versions, the check, the weights' sha256) beside the model.

  .venv-bench/bin/python bench/export_ct2.py --model-dir models/all-MiniLM-L6-v2 \
      --out-dir .cache/bench/ct2
"""
import argparse
import json
import os

import ctranslate2
import numpy as np
import torch
import transformers
from ctranslate2.converters import TransformersConverter
from transformers import AutoModel

from export_onnx import file_sha256


class Converter(TransformersConverter):
    """CTranslate2 4.8 asks from_pretrained for `dtype=`; transformers 4.40 (the last line that
    accepts Debian's torch 1.13) calls it `torch_dtype`."""

    def load_model(self, model_class, model_name_or_path, **kwargs):
        kwargs["torch_dtype"] = kwargs.pop("dtype", None)
        return super().load_model(model_class, model_name_or_path, **kwargs)


def pooled(hidden, lengths):
    """Mean over each sequence's own tokens, L2-normalised: (B, T, H) -> (B, H)."""
    mask = (np.arange(hidden.shape[1])[None, :] < np.asarray(lengths)[:, None])[:, :, None]
    out = (hidden * mask).sum(1) / np.asarray(lengths, dtype=np.float32)[:, None]
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    Converter(args.model_dir).convert(args.out_dir, force=True)

    rng = np.random.default_rng(7)
    lengths = [24, 11]
    sequences = [[101] + rng.integers(1000, 30000, n - 2).tolist() + [102] for n in lengths]
    encoder = ctranslate2.Encoder(args.out_dir, device="cpu", compute_type="float32")
    ours = pooled(np.asarray(encoder.forward_batch(sequences).last_hidden_state), lengths)
    bert = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager",
                                     add_pooling_layer=False).eval()
    ids = torch.zeros(2, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, seq in enumerate(sequences):
        ids[b, :len(seq)] = torch.tensor(seq)
        mask[b, :len(seq)] = 1
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    reference = pooled(hidden, lengths)
    diff = float(np.abs(ours - reference).max())
    if diff > 1e-4:
        raise SystemExit(f"CTranslate2's float32 encoder differs from PyTorch: max |diff| {diff}")
    meta = {"weights_sha256": file_sha256(os.path.join(args.model_dir, "model.safetensors")),
            "exporter_sha256": file_sha256(os.path.abspath(__file__)),
            "ctranslate2": ctranslate2.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "max_abs_diff_to_torch": diff}
    with open(os.path.join(args.out_dir, "export.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
