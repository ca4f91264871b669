#!/usr/bin/env python3
"""Helpers for deploy/test.sh (standard library only).

  free-ports N                         N free TCP ports on 127.0.0.1, one per line
  compare A.json B.json [--tolerance T]
                                       compare two `attnctl ... --json` outputs (Encode or
                                       AttentionMap): same tokens, versions and tensor shapes;
                                       float values within T; prints the largest difference
  prom-wait URL QUERY --min V [--timeout S] [--label k=v ...]
                                       poll Prometheus' query API until QUERY has a sample
                                       (with those labels) whose value is >= V
  prom-exprs URL DASHBOARD.json        every panel expression of a Grafana dashboard is
                                       accepted by Prometheus (status success)
"""
import argparse
import base64
import json
import socket
import struct
import sys
import time
import urllib.parse
import urllib.request


def free_ports(count):
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    print("\n".join(str(p) for p in ports))
    return 0


def tensor_values(tensor):
    """attnctl's JSON tensor {shape, dtype, data (base64)} -> (shape, floats)."""
    if tensor.get("dtype", "FLOAT32") != "FLOAT32":
        raise ValueError(f"unexpected dtype {tensor.get('dtype')}")
    raw = base64.b64decode(tensor.get("data", ""))
    shape = [int(d) for d in tensor.get("shape", [])]
    return shape, list(struct.unpack(f"<{len(raw) // 4}f", raw))


def walk(a, b, path, state):
    """Walks two JSON values in parallel; floats and tensors are compared with a tolerance."""
    if isinstance(a, dict) and isinstance(b, dict):
        if "data" in a and "shape" in a:
            shape_a, values_a = tensor_values(a)
            shape_b, values_b = tensor_values(b)
            if shape_a != shape_b:
                state["problems"].append(f"{path}: shape {shape_a} vs {shape_b}")
                return
            for x, y in zip(values_a, values_b):
                state["max_diff"] = max(state["max_diff"], abs(x - y))
            state["values"] += len(values_a)
            return
        if set(a) != set(b):
            state["problems"].append(f"{path}: keys {sorted(a)} vs {sorted(b)}")
            return
        for key in a:
            if key == "metadata":  # timings differ by nature
                continue
            walk(a[key], b[key], f"{path}.{key}", state)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            state["problems"].append(f"{path}: {len(a)} vs {len(b)} items")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]", state)
    elif isinstance(a, float) or isinstance(b, float):
        state["max_diff"] = max(state["max_diff"], abs(float(a) - float(b)))
        state["values"] += 1
    elif a != b:
        state["problems"].append(f"{path}: {a!r} vs {b!r}")


def compare(path_a, path_b, tolerance):
    with open(path_a) as fa, open(path_b) as fb:
        a, b = json.load(fa), json.load(fb)
    state = {"max_diff": 0.0, "values": 0, "problems": []}
    walk(a, b, "$", state)
    if state["values"] == 0:
        state["problems"].append("no numbers to compare")
    for problem in state["problems"][:20]:
        print(f"  difference: {problem}")
    ok = not state["problems"] and state["max_diff"] <= tolerance
    print(f"  {state['values']} values, max |difference| {state['max_diff']:.3g} "
          f"(tolerance {tolerance:g})")
    return 0 if ok else 1


def prom_query(url, query):
    full = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(full, timeout=10) as response:
        return json.load(response)


def prom_wait(url, query, minimum, timeout, labels):
    wanted = dict(label.split("=", 1) for label in labels)
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            answer = prom_query(url, query)
            for sample in answer.get("data", {}).get("result", []):
                metric = sample.get("metric", {})
                value = float(sample["value"][1])
                if all(metric.get(k) == v for k, v in wanted.items()) and value >= minimum:
                    print(f"  {query}{{{','.join(f'{k}={v}' for k, v in wanted.items())}}} = "
                          f"{value:g} (job {metric.get('job')}, instance {metric.get('instance')})")
                    return 0
            last = json.dumps(answer)[:300]
        except OSError as error:
            last = str(error)
        time.sleep(1)
    print(f"  Prometheus never returned {query} >= {minimum} with {wanted}; last answer: {last}")
    return 1


def prom_exprs(url, dashboard_path):
    with open(dashboard_path) as f:
        dashboard = json.load(f)
    failures = 0
    count = 0
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            count += 1
            try:
                answer = prom_query(url, target["expr"])
                ok = answer.get("status") == "success"
            except OSError as error:
                ok, answer = False, str(error)
            if not ok:
                failures += 1
                print(f"  panel '{panel.get('title')}': {target['expr']}: {answer}")
    print(f"  {count} dashboard expressions, {failures} rejected by Prometheus")
    return 1 if failures or count == 0 else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("free-ports")
    p.add_argument("count", type=int)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tolerance", type=float, default=1e-5)
    p = sub.add_parser("prom-wait")
    p.add_argument("url")
    p.add_argument("query")
    p.add_argument("--min", type=float, default=1)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--label", action="append", default=[])
    p = sub.add_parser("prom-exprs")
    p.add_argument("url")
    p.add_argument("dashboard")
    args = parser.parse_args()
    if args.command == "free-ports":
        return free_ports(args.count)
    if args.command == "compare":
        return compare(args.a, args.b, args.tolerance)
    if args.command == "prom-wait":
        return prom_wait(args.url, args.query, args.min, args.timeout, args.label)
    return prom_exprs(args.url, args.dashboard)


if __name__ == "__main__":
    sys.exit(main())
