#!/usr/bin/env python3
"""ONNX Runtime peer of the benchmark harness: a worker (bench/peer_worker.py protocol) running
an ONNX export of the model (bench/export_onnx.py: BertModel + mean pooling + L2 normalise) on
the CPU execution provider, all graph optimisations on, --threads intra-op threads.

Batches are right-padded to their longest sequence with an attention mask (ONNX Runtime needs a
rectangular tensor); the padded arrays are built at load time, outside the timed runs.

  .venv-bench/bin/python bench/peer_ort.py --model .cache/bench/onnx/model-fp32.onnx --threads 2
"""
import argparse

import numpy as np
import onnxruntime

from peer_worker import Worker, padded_feeds, protocol_stream


class OrtWorker(Worker):
    def __init__(self, model_path, threads, label):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = onnxruntime.InferenceSession(model_path, options,
                                                    providers=["CPUExecutionProvider"])
        self.feeds = {}
        self.info = {"engine": f"onnxruntime-{label}", "onnxruntime": onnxruntime.__version__,
                     "threads": threads, "model": model_path}

    def prepare(self, workloads):
        self.feeds = padded_feeds(workloads, {i.name for i in self.session.get_inputs()})

    def run(self, name):
        return self.session.run(["embedding"], self.feeds[name])[0]

    def embed(self, name):
        return self.run(name).astype(np.float32).tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="ONNX file (fp32 or int8 export)")
    parser.add_argument("--label", default="fp32", help="engine name suffix in reports")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = protocol_stream()
    OrtWorker(args.model, args.threads, args.label).serve(out)


if __name__ == "__main__":
    main()
