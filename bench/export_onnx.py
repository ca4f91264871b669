#!/usr/bin/env python3
"""Exports all-MiniLM-L6-v2 to ONNX for the ONNX Runtime peer of the benchmark harness.

The graph is Hugging Face BertModel (fp32, eager attention) followed by sentence-transformers'
mean pooling and L2 normalisation, so it returns what attnserve's engine returns by default:
one unit-length embedding per sequence. Inputs `input_ids`, `attention_mask`, `token_type_ids`
(int64, [batch, seq]); output `embedding` ([batch, hidden]). Batch and sequence are dynamic.

Writes into --out-dir (ONNX Runtime's documented recipe for BERT on CPU: export, fuse, then
quantise):
  model-export.onnx the plain export (torch.onnx.export, opset --opset)
  model-fp32.onnx   it after onnxruntime.transformers.optimizer (model_type bert): fused
                    EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu; ONNX
                    Runtime's session-level optimiser alone does not fuse attention
  model-int8.onnx   onnxruntime.quantization.quantize_dynamic of model-fp32.onnx (s8 weights per
                    channel, u8 activations quantised at run time)
  export.json       versions, the weights' sha256 and the max difference to PyTorch on a check
                    batch; bench/run.sh re-exports when the weights or this script change.

Run with the benchmark venv (bench/run.sh makes it):
  .venv-bench/bin/python bench/export_onnx.py --model-dir models/all-MiniLM-L6-v2 \
      --out-dir .cache/bench/onnx
"""
import argparse
import hashlib
import json
import os

import numpy as np
import onnx
import onnxruntime
import torch
import transformers
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.optimizer import optimize_model
from transformers import AutoModel


class PooledEncoder(torch.nn.Module):
    """BertModel -> mean over the attention mask -> L2 normalise (sentence-transformers)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        # MPNet has no token types (its forward takes none): the graph then has two inputs.
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           **types).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)                 # (B, T, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)        # (B, H)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_batch(vocab_size):
    """Two padded sequences of different lengths: exercises the mask in the exported graph."""
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(1000, vocab_size, (2, 24), generator=generator)
    ids[:, 0] = 101
    ids[0, 23] = 102
    ids[1, 11] = 102
    ids[1, 12:] = 0
    mask = (ids != 0).long()
    mask[0, :] = 1
    return ids, mask, torch.zeros_like(ids)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=os.path.join(here, "..", "models",
                                                            "all-MiniLM-L6-v2"))
    parser.add_argument("--out-dir", default=os.path.join(here, "..", ".cache", "bench", "onnx"))
    parser.add_argument("--opset", type=int, default=14)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    export_path = os.path.join(args.out_dir, "model-export.onnx")
    fp32_path = os.path.join(args.out_dir, "model-fp32.onnx")
    int8_path = os.path.join(args.out_dir, "model-int8.onnx")

    transformers.logging.set_verbosity_error()  # the unused pooler.* weights are expected
    bert = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager",
                                     add_pooling_layer=False).eval()
    model = PooledEncoder(bert).eval()
    ids, mask, types = check_batch(bert.config.vocab_size)
    # The same recipe for every family; MPNet (relative position bias) has no token types.
    has_types = bert.config.model_type != "mpnet"
    inputs = (ids, mask, types) if has_types else (ids, mask)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if has_types else [])
    with torch.no_grad():
        torch.onnx.export(model, inputs, export_path, input_names=names,
                          output_names=["embedding"],
                          dynamic_axes=dict({n: {0: "batch", 1: "seq"} for n in names},
                                            embedding={0: "batch"}),
                          opset_version=args.opset, do_constant_folding=True)
        reference = model(*inputs).numpy()
    onnx.checker.check_model(export_path)

    optimized = optimize_model(export_path, model_type="bert", num_heads=bert.config.num_attention_heads,
                               hidden_size=bert.config.hidden_size, opt_level=1)
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    # ORT's fusion knows BERT's attention; MPNet's (a position bias added to the scores) stays
    # unfused, the rest (LayerNorm, GELU, ...) fuses as for BERT. Recorded in export.json.
    if has_types and fused.get("Attention", 0) != bert.config.num_hidden_layers:
        raise SystemExit(f"the ONNX Runtime optimizer did not fuse every attention layer: {fused}")
    optimized.save_model_to_file(fp32_path)

    # Shape inference cannot type the outputs of the fused contrib ops; they are all float.
    quantize_dynamic(fp32_path, int8_path, weight_type=QuantType.QInt8, per_channel=True,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})

    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    if has_types:
        feeds["token_type_ids"] = types.numpy()
    report = {}
    for name, path in (("export", export_path), ("fp32", fp32_path), ("int8", int8_path)):
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        out = session.run(["embedding"], feeds)[0]
        report[name] = {"max_abs_diff_to_torch": float(np.abs(out - reference).max()),
                        "min_cosine_to_torch": float((out * reference).sum(1).min())}
    # fp32 must be the same function; int8 only close to it.
    for name in ("export", "fp32"):
        if report[name]["max_abs_diff_to_torch"] > 1e-4:
            raise SystemExit(f"ONNX {name} model differs from PyTorch: {report[name]}")
    if report["int8"]["min_cosine_to_torch"] < 0.9:
        # quantize_dynamic breaks MPNet's unfused graph (min cosine 0.005 measured): its int8
        # file is kept for the record but no bench row uses it (the mpnet section is fp32).
        if has_types:
            raise SystemExit(f"ONNX int8 model is far from PyTorch: {report['int8']}")
        report["int8"]["unusable"] = True

    meta = {"weights_sha256": file_sha256(os.path.join(args.model_dir, "model.safetensors")),
            "exporter_sha256": file_sha256(os.path.abspath(__file__)),
            "opset": args.opset, "torch": torch.__version__,
            "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "fused": fused, "check": report}
    with open(os.path.join(args.out_dir, "export.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
