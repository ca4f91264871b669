#!/usr/bin/env python3
"""OpenVINO peer of the benchmark harness: a worker (bench/peer_worker.py protocol) running the
harness's ONNX export (bench/export_onnx.py's model-export.onnx: BertModel + mean pooling + L2
normalise, before ONNX Runtime's fusions, which use ONNX Runtime's own operators) or its NNCF
int8 quantisation (bench/quantize_openvino.py) on OpenVINO's CPU plugin.

  --precision fp32  the f32 inference-precision hint pinned: on CPUs with avx512_bf16 or AMX the
                    CPU plugin otherwise runs bf16 without being asked
  --precision bf16  the bf16 hint (native on avx512_bf16/AMX; OpenVINO refuses it elsewhere)
  --precision int8  the NNCF model; the plugin's default hint for what stays unquantised

One stream, --threads inference threads, latency mode: one request at a time, as every other
engine of the harness runs. Batches are right-padded to their longest sequence with an attention
mask, built at load time outside the timed runs. Runs in .venv-bench-openvino (bench/run.sh), a
venv of its own: openvino and nncf need numpy 2, Debian's torch in .venv-bench numpy < 2.

  .venv-bench-openvino/bin/python bench/peer_openvino.py \
      --model .cache/bench/onnx/model-export.onnx --precision fp32 --threads 2
"""
import argparse
import json

import numpy as np
import openvino

from peer_worker import Worker, padded_feeds, protocol_stream

HINTS = {"fp32": "f32", "bf16": "bf16", "int8": None}


class OpenVinoWorker(Worker):
    def __init__(self, model_path, precision, threads):
        core = openvino.Core()
        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
                  "PERFORMANCE_HINT": "LATENCY"}
        if HINTS[precision] is not None:
            config["INFERENCE_PRECISION_HINT"] = HINTS[precision]
        self.compiled = core.compile_model(core.read_model(model_path), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.wanted = {port.get_any_name() for port in self.compiled.inputs}
        self.feeds = {}
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        executed = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        if precision == "bf16" and executed != "bf16":
            raise RuntimeError(f"OpenVINO runs {executed}, not bf16, on this CPU")
        self.info = {"engine": f"openvino-{precision}", "openvino": openvino.__version__,
                     "inference_precision": executed, "threads": threads, "model": model_path}

    def prepare(self, workloads):
        self.feeds = padded_feeds(workloads, self.wanted)

    def run(self, name):
        return self.request.infer(self.feeds[name])[self.compiled.output(0)]

    def embed(self, name):
        return np.asarray(self.run(name), dtype=np.float32).tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="ONNX export or NNCF int8 IR (.xml)")
    parser.add_argument("--precision", choices=sorted(HINTS), default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = protocol_stream()
    try:
        worker = OpenVinoWorker(args.model, args.precision, args.threads)
    except Exception as e:  # the harness records why this peer did not run
        out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    worker.serve(out)


if __name__ == "__main__":
    main()
