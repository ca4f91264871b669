"""The JSON-lines worker protocol (bench/bench_worker.h) for the Python peers.

A worker prints one ready line, then answers each command line with one JSON line:
  {"cmd": "info"} | {"cmd": "load", "inputs": PATH} | {"cmd": "run", "workload": N, "repeat": K}
  | {"cmd": "embed", "workload": N, "out": PATH} | {"cmd": "quit"}
Errors answer {"error": ...} and the worker goes on. Anything the libraries print on stdout
(fd 1, Python or C) is sent to stderr so it cannot corrupt the protocol.
"""
import json
import os
import sys
import time
import traceback


def protocol_stream():
    """A file on the original stdout; fd 1 (and sys.stdout) then point at stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def load_workloads(path):
    with open(path) as f:
        return json.load(f)["workloads"]


def padded(sequences, pad_id=0):
    """Right-pads to the longest sequence (what Hugging Face padding="longest" does):
    (ids, attention_mask) as lists of equal-length rows."""
    width = max(len(s) for s in sequences)
    ids = [list(s) + [pad_id] * (width - len(s)) for s in sequences]
    mask = [[1] * len(s) + [0] * (width - len(s)) for s in sequences]
    return ids, mask


def padded_feeds(workloads, wanted):
    """{workload: {input: int64 array}} for the workloads with sequences, as an exported graph
    takes them: input_ids right-padded, attention_mask and token_type_ids (zeros), keeping only
    the graph's own inputs `wanted` (an MPNet export has no token_type_ids). Built at load time,
    outside the timed runs."""
    import numpy as np

    feeds = {}
    for name, spec in workloads.items():
        if "sequences" not in spec:
            continue
        ids, mask = padded(spec["sequences"])
        ids = np.asarray(ids, dtype=np.int64)
        all_inputs = {"input_ids": ids, "attention_mask": np.asarray(mask, dtype=np.int64),
                      "token_type_ids": np.zeros_like(ids)}
        feeds[name] = {k: v for k, v in all_inputs.items() if k in wanted}
    return feeds


def time_calls(fn, repeat):
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


class Worker:
    """Subclasses set self.info and implement prepare(workloads), run(name), embed(name)."""

    info = {}

    def prepare(self, workloads):
        raise NotImplementedError

    def run(self, name):
        raise NotImplementedError

    def embed(self, name):
        """The pooled embeddings as a list of float rows."""
        raise NotImplementedError

    def handle(self, command):
        cmd = command["cmd"]
        if cmd == "info":
            return self.info
        if cmd == "load":
            workloads = load_workloads(command["inputs"])
            self.prepare(workloads)
            return {"workloads": sorted(workloads)}
        if cmd == "run":
            name = command["workload"]
            reply = {"seconds": time_calls(lambda: self.run(name), int(command.get("repeat", 1)))}
            reply.update(getattr(self, "last_extra", {}))
            return reply
        if cmd == "embed":
            import array
            rows = self.embed(command["workload"])
            with open(command["out"], "wb") as f:
                array.array("f", [x for row in rows for x in row]).tofile(f)
            return {"rows": len(rows), "dim": len(rows[0]) if rows else 0}
        raise ValueError(f"unknown command {cmd!r}")

    def serve(self, out):
        out.write(json.dumps(dict(self.info, ready=True)) + "\n")
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                command = json.loads(line)
                if command.get("cmd") == "quit":
                    out.write(json.dumps({"bye": True}) + "\n")
                    return
                reply = self.handle(command)
            except Exception as e:  # reported to the harness, the worker keeps going
                traceback.print_exc()
                reply = {"error": f"{type(e).__name__}: {e}"}
            out.write(json.dumps(reply) + "\n")
