#!/usr/bin/env python3
"""NNCF post-training int8 quantisation of the harness's ONNX export for the OpenVINO int8 peer
(bench/peer_openvino.py --precision int8): OpenVINO reads model-export.onnx, nncf.quantize with
the transformer model type calibrates on 300 sentences that are not the benchmark's (the same
generator, bench/sentences.py, with another seed; any sentence that also occurs in the
benchmark's pool is dropped), tokenized by Hugging Face `tokenizers` from the model's
tokenizer.json, one sentence per calibration sample. Writes model-int8-nncf.xml/.bin beside the
export. Runs in .venv-bench-openvino (bench/run.sh).

  .venv-bench-openvino/bin/python bench/quantize_openvino.py --model-dir models/all-MiniLM-L6-v2 \
      --onnx-dir .cache/bench/onnx
"""
import argparse
import json
import os

import nncf
import numpy as np
import openvino
import tokenizers

import sentences

CALIBRATION_SEED = 77
CALIBRATION_SIZE = 300
BENCHMARK_POOL = (4000, 2024)  # bench/harness.py: sentences.sentence_pool(4000), default seed


def calibration_sentences():
    benchmark = set(sentences.sentence_pool(*BENCHMARK_POOL))
    pool = sentences.sentence_pool(4 * CALIBRATION_SIZE, seed=CALIBRATION_SEED)
    fresh = [s for s in dict.fromkeys(pool) if s not in benchmark]
    if len(fresh) < CALIBRATION_SIZE:
        raise SystemExit(f"only {len(fresh)} calibration sentences outside the benchmark's")
    return fresh[:CALIBRATION_SIZE]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--onnx-dir", required=True)
    args = parser.parse_args()
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    model = openvino.Core().read_model(os.path.join(args.onnx_dir, "model-export.onnx"))
    wanted = {port.get_any_name() for port in model.inputs}
    samples = []
    for text in calibration_sentences():
        ids = np.asarray([tokenizer.encode(text).ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.zeros_like(ids)}
        samples.append({k: v for k, v in feeds.items() if k in wanted})
    quantized = nncf.quantize(model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(samples))
    out = os.path.join(args.onnx_dir, "model-int8-nncf.xml")
    openvino.save_model(quantized, out)
    print(json.dumps({"nncf": nncf.__version__, "openvino": openvino.__version__,
                      "calibration_sentences": len(samples), "model": out}))


if __name__ == "__main__":
    main()
