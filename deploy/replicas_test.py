#!/usr/bin/env python3
"""The replicated deployment, run: one trainer, three serving replicas following one model store
(--watch-store), Debian's HAProxy in front of gRPC and HTTP (deploy/replicas/haproxy.cfg, the
balancer config deploy/compose-replicas.yml uses), and a real Prometheus scraping all four.
The processes run on loopback on this host (deploy/replicas_test.sh says why). Under a steady
client load through the balancer (gRPC Encode calls through the attnserve Python client, with
its retry policy, and HTTP /v1/embeddings), it:

  1. promotes a new version on the trainer and measures how long until every replica serves it
     (must be <= 2 x --watch-store), with zero failed calls;
  2. kills one replica with SIGKILL: counts client-visible errors (must be <= --max-kill-errors),
     zero lost or wrong answers; restarts it and sees it take calls again;
  3. restarts every replica in turn with SIGTERM (rolling): zero failed calls;
  4. asks Prometheus: 4 targets up, attnserve_queue_depth of each replica, and the autoscaling
     metric as the Prometheus adapter rule computes it (deploy/k8s/prometheus-adapter.yaml);
  5. ramps the load and checks that the per-replica queue depth (the HPA's metric) rises at a
     lower load than the latency does.

Every answer is checked: its embedding must equal the reference embedding of the version it
says computed it (max abs difference <= 1e-5), so a wrong or mixed-up version is caught.
Prints one line per measurement and a JSON summary; exits 1 if a check failed.
"""
import argparse
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

import attnserve

TEXTS = [
    "How do I reset my password?",
    "The parcel arrived two days late.",
    "Refunds are issued within 5 business days.",
    "A red bicycle leans against the wall.",
    "Where is the nearest train station?",
    "The meeting moved to Tuesday afternoon.",
    "Fresh bread from the bakery around the corner.",
    "Our office is in Berlin.",
]
PAIRS = [{"anchor": a, "positive": p} for a, p in [
    ("reset my password", "How do I change my login credentials?"),
    ("late delivery", "The parcel arrived two days late."),
    ("money back", "Refunds are issued within 5 business days."),
    ("bike", "A red bicycle leans against the wall."),
    ("train", "Where is the nearest train station?"),
    ("schedule change", "The meeting moved to Tuesday afternoon."),
    ("bakery", "Fresh bread from the bakery around the corner."),
    ("headquarters", "Our office is in Berlin."),
]]
TOLERANCE = 1e-5
FAILURES = []


def log(message):
    print(f"[replicas {time.monotonic() - START:6.1f}s] {message}", flush=True)


def check(ok, message):
    log(("PASS " if ok else "FAIL ") + message)
    if not ok:
        FAILURES.append(message)
    return ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One attnserve process; restartable on the ports it got the first time."""

    def __init__(self, name, args, work):
        self.name, self.args, self.work = name, args, work
        self.ports = None
        self.process = None
        self.log_path = work / f"{name}.log"

    def start(self, timeout=120):
        ready = self.work / f"{self.name}.ready"
        ready.unlink(missing_ok=True)
        ports = (["--port", "0", "--http-port", "0", "--metrics-port", "0"] if self.ports is None
                 else ["--port", str(self.ports["grpc_port"]), "--http-port",
                       str(self.ports["http_port"]), "--metrics-port",
                       str(self.ports["metrics_port"])])
        with open(self.log_path, "a") as out:
            self.process = subprocess.Popen(
                self.args + ports + ["--host", "127.0.0.1", "--ready-file", str(ready)],
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-2000:]}")
            try:
                self.ports = json.loads(ready.read_text())
                return
            except (OSError, ValueError):
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready in {timeout} s")

    def signal(self, number):
        self.process.send_signal(number)

    def wait(self, timeout=60):
        return self.process.wait(timeout)

    @property
    def grpc(self):
        return f"127.0.0.1:{self.ports['grpc_port']}"

    def metric(self, name, labels=None):
        """The sum of a metric's samples on this server's /metrics (None if unreachable)."""
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.ports['metrics_port']}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if labels and not all(f'{k}="{v}"' in line for k, v in labels.items()):
                continue
            total += float(line.rsplit(" ", 1)[1])
        return total


class Load:
    """Client threads calling through the balancer until stopped; every answer checked."""

    def __init__(self, lb_grpc, lb_http, references, grpc_threads, http_threads=1):
        self.lb_grpc, self.lb_http = lb_grpc, lb_http
        self.references = references  # version -> (len(TEXTS), hidden) array
        self.lock = threading.Lock()
        self.calls = []  # (start, end, protocol, ok, detail)
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._grpc, args=(i,), daemon=True)
                        for i in range(grpc_threads)]
        self.threads += [threading.Thread(target=self._http, args=(i,), daemon=True)
                         for i in range(http_threads)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(120)

    def _record(self, start, protocol, ok, detail=""):
        with self.lock:
            self.calls.append((start, time.monotonic(), protocol, ok, detail))

    def _grpc(self, index):
        client = attnserve.Client(self.lb_grpc, timeout=30)
        i = index
        while not self.stop_event.is_set():
            i += 1
            text = i % len(TEXTS)
            start = time.monotonic()
            try:
                result = client.encode_full([TEXTS[text]])
            except Exception as e:  # noqa: BLE001 - every failure is a counted client error
                self._record(start, "grpc", False, f"error: {e}")
                continue
            reference = self.references.get(result.model_version)
            if reference is None:
                self._record(start, "grpc", False, f"unknown version {result.model_version}")
                continue
            diff = float(np.max(np.abs(result.embeddings[0] - reference[text])))
            self._record(start, "grpc", diff <= TOLERANCE,
                         "" if diff <= TOLERANCE else f"wrong answer (diff {diff})")

    def _http(self, index):
        i = index
        while not self.stop_event.is_set():
            i += 1
            text = i % len(TEXTS)
            start = time.monotonic()
            body = json.dumps({"input": TEXTS[text]}).encode()
            request = urllib.request.Request(f"http://{self.lb_http}/v1/embeddings", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    vector = np.asarray(json.load(r)["data"][0]["embedding"], dtype=np.float32)
            except (OSError, ValueError, KeyError) as e:
                self._record(start, "http", False, f"error: {e}")
                continue
            diffs = [float(np.max(np.abs(vector - ref[text]))) for ref in self.references.values()]
            ok = min(diffs) <= TOLERANCE
            self._record(start, "http", ok, "" if ok else f"wrong answer (diff {min(diffs)})")

    def window(self, since, until=None):
        with self.lock:
            return [c for c in self.calls if c[1] >= since and (until is None or c[0] <= until)]


def summarize(calls):
    failed = [c for c in calls if not c[3]]
    wrong = [c for c in failed if c[4].startswith(("wrong", "unknown"))]
    return len(calls), len(failed), len(wrong), sorted({c[4][:160] for c in failed})[:5]


def prometheus_query(url, query):
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": query}), timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{query}: {body}")
    return body["data"]["result"]


def references_of(server, version=""):
    client = attnserve.Client(server.grpc, timeout=60)
    rows = []
    for text in TEXTS:  # one text per call, as the load sends them
        result = client.encode_full([text], model_version=version)
        rows.append(result.embeddings[0])
    return result.model_version, np.stack(rows)


def wait_for(condition, timeout, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


def served_version(server):
    try:
        return attnserve.Client(server.grpc, timeout=5).model_info().version
    except Exception:  # noqa: BLE001 - a replica restarting
        return None


def answered(server):
    """Encode (gRPC) and /v1/embeddings (HTTP) calls the server answered OK; None if down."""
    counts = [server.metric("attnserve_requests_total", {"method": m, "code": "OK"})
              for m in ("Encode", "Embeddings")]
    return None if None in counts else sum(counts)


def taking_calls(server, since_count):
    count = answered(server)
    return count is not None and count > since_count


def phase_promotion(trainer, replicas, load, references, watch_s, summary):
    result = attnserve.Client(trainer.grpc, trainer_token=TOKEN, timeout=300).finetune(
        PAIRS, "contrastive", batch_size=8, epochs=1, learning_rate=2e-5, commit=True,
        promote=False, progress=False, description="replica test")
    version = result.committed_version
    log(f"trainer committed {version} (staged)")
    # Its reference, from the trainer (the same binary; pinned, since it is not served yet).
    _, references[version] = references_of(trainer, version)
    start = time.monotonic()
    attnserve.Client(trainer.grpc, trainer_token=TOKEN).promote(version)
    promoted = time.monotonic()
    seen = {}
    while len(seen) < len(replicas) and time.monotonic() - promoted < 10 * watch_s + 30:
        for r in replicas:
            if r.name not in seen and served_version(r) == version:
                seen[r.name] = time.monotonic() - promoted
        time.sleep(0.02)
    propagation = max(seen.values()) if len(seen) == len(replicas) else None
    time.sleep(1)  # calls answered by the new version through the balancer
    calls, failed, wrong, examples = summarize(load.window(start))
    summary["promotion"] = {"version": version, "per_replica_s": seen,
                            "propagation_s": propagation, "calls": calls, "failed": failed}
    check(propagation is not None and propagation <= 2 * watch_s,
          f"promotion reached all {len(replicas)} replicas in "
          f"{propagation if propagation is None else round(propagation, 3)} s "
          f"(<= 2 x --watch-store {watch_s} s; each: "
          f"{ {k: round(v, 3) for k, v in seen.items()} })")
    check(failed == 0, f"during the promotion: {calls} calls, {failed} failed {examples}")
    return version


def phase_kill(replica, load, max_errors, summary):
    before = time.monotonic()
    time.sleep(1)
    killed = time.monotonic()
    replica.signal(signal.SIGKILL)
    replica.wait()
    log(f"SIGKILL {replica.name}")
    time.sleep(4)
    calls, failed, wrong, examples = summarize(load.window(killed, time.monotonic()))
    check(failed <= max_errors and wrong == 0,
          f"SIGKILL of {replica.name}: {calls} calls in the next 4 s, {failed} client-visible "
          f"errors (<= {max_errors}), {wrong} wrong answers {examples}")
    count = replica.metric("attnserve_requests_total") or 0
    restart = time.monotonic()
    replica.start()
    rejoined = wait_for(lambda: taking_calls(replica, 0), 30, 0.1)
    rejoin_s = time.monotonic() - restart
    check(rejoined, f"{replica.name} restarted and took calls through the balancer again "
                    f"{rejoin_s:.1f} s after the restart began")
    calls_all, failed_all, wrong_all, _ = summarize(load.window(before))
    summary["kill"] = {"replica": replica.name, "calls_4s": calls, "errors": failed,
                       "wrong": wrong, "rejoin_s": round(rejoin_s, 2), "count_before": count}


def phase_rolling(replicas, load, summary):
    start = time.monotonic()
    for r in replicas:
        r.signal(signal.SIGTERM)
        code = r.wait(60)
        check(code == 0, f"SIGTERM {r.name}: drained, exit {code}")
        r.start()
        check(wait_for(lambda r=r: taking_calls(r, 0), 30, 0.1),
              f"{r.name} back behind the balancer")
    time.sleep(1)
    calls, failed, wrong, examples = summarize(load.window(start))
    summary["rolling"] = {"calls": calls, "failed": failed, "wrong": wrong,
                          "seconds": round(time.monotonic() - start, 1)}
    check(failed == 0, f"rolling SIGTERM restart of 3 replicas in {time.monotonic() - start:.1f} s: "
                       f"{calls} calls, {failed} failed {examples}")


def adapter_query(rules_path):
    """The HPA metric's PromQL as prometheus-adapter's rule renders it for the replicas."""
    text = rules_path.read_text()
    series = re.search(r'seriesQuery:\s*[\'"]?([a-z_]+)', text).group(1)
    template = re.search(r"metricsQuery:\s*['\"]?(.+?)['\"]?\s*$", text, re.M).group(1)
    return (template.replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'job="attnserve-replicas"')
            .replace("<<.GroupBy>>", "instance"))


def phase_prometheus(prometheus_url, rules_path, summary):
    def up():
        try:
            return prometheus_query(prometheus_url, "up == 1")
        except Exception:  # noqa: BLE001
            return []
    wait_for(lambda: len(up()) >= 4, 30, 0.5)
    targets = sorted(r["metric"]["instance"] for r in up())
    check(len(targets) == 4, f"Prometheus sees {len(targets)} targets up: {targets}")
    depth = prometheus_query(prometheus_url, 'sum by (instance) (attnserve_queue_depth'
                                             '{job="attnserve-replicas"})')
    check(len(depth) == 3, "Prometheus has attnserve_queue_depth of each replica: " +
          ", ".join(f"{d['metric']['instance']}={d['value'][1]}" for d in depth))
    query = adapter_query(rules_path)
    hpa = prometheus_query(prometheus_url, query)
    check(len(hpa) == 3, f"the adapter rule's query ({query}) gives one value per replica")
    summary["prometheus"] = {"targets": targets, "adapter_query": query}


def phase_ramp(replicas, lb_grpc, lb_http, references, summary, steps, step_s):
    """Load steps: per-replica queue depth (sampled) vs the calls' latency."""
    rows = []
    for concurrency in steps:
        load = Load(lb_grpc, lb_http, references, concurrency, http_threads=0).start()
        time.sleep(0.5)
        samples, start = [], time.monotonic()
        while time.monotonic() - start < step_s:
            values = [r.metric("attnserve_queue_depth") for r in replicas]
            samples.append(sum(v or 0 for v in values) / len(replicas))
            time.sleep(0.05)
        load.stop()
        latencies = [c[1] - c[0] for c in load.window(start) if c[3]]
        failed = sum(1 for c in load.window(start) if not c[3])
        rows.append({"concurrency": concurrency, "queue_depth_per_replica": float(np.mean(samples)),
                     "p50_ms": 1e3 * float(np.median(latencies)),
                     "p95_ms": 1e3 * float(np.percentile(latencies, 95)),
                     "calls_per_s": len(latencies) / step_s, "failed": failed})
        log("ramp: " + json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                   for k, v in rows[-1].items()}))
    # Relative to the lowest load. By Little's law the calls in a replica are its throughput
    # times their latency, so the depth rises with the load from the first step on, before
    # (and more than) the latency does, as long as the replicas still take more calls.
    base = rows[0]
    for r in rows:
        r["depth_ratio"] = r["queue_depth_per_replica"] / base["queue_depth_per_replica"]
        r["p50_ratio"] = r["p50_ms"] / base["p50_ms"]
    summary["ramp"] = {"rows": rows}
    second = rows[1]
    check(second["depth_ratio"] >= 1.5 and
          all(r["depth_ratio"] > r["p50_ratio"] for r in rows[1:]),
          "the HPA's metric leads the latency: queue depth per replica x" +
          ", x".join(f"{r['depth_ratio']:.2f}" for r in rows[1:]) + " against p50 x" +
          ", x".join(f"{r['p50_ratio']:.2f}" for r in rows[1:]) +
          f" at {', '.join(str(r['concurrency']) for r in rows[1:])} clients "
          f"(depth up >= 50% at {second['concurrency']} clients)")
    check(all(r["failed"] == 0 for r in rows), "no failed call during the ramp")


def start_processes(args, work):
    store = work / "store"
    store.mkdir()
    (work / "token").write_text(TOKEN + "\n")
    common = [args.attnserve, "--model-dir", args.model_dir, "--threads", "1",
              "--log-level", "info", "--model-store", str(store)]
    trainer = Server("trainer", common + ["--trainer-token-file", str(work / "token")], work)
    # --shutdown-delay-s: HAProxy's checks (every 0.5 s, down after 2) take a replica out
    # before it stops accepting calls.
    replicas = [Server(f"replica{i}", common + ["--watch-store", str(args.watch_s),
                                                "--drain-timeout-s", "20",
                                                "--shutdown-delay-s", "1.5"], work)
                for i in (1, 2, 3)]
    for server in [trainer] + replicas:
        server.start()
    lb = {"LB_BIND": "127.0.0.1", "LB_GRPC_PORT": str(free_port()),
          "LB_HTTP_PORT": str(free_port()), "LB_STATS_PORT": str(free_port())}
    for i, r in enumerate(replicas, 1):
        lb.update({f"R{i}_HOST": "127.0.0.1", f"R{i}_GRPC_PORT": str(r.ports["grpc_port"]),
                   f"R{i}_HTTP_PORT": str(r.ports["http_port"])})
    haproxy = subprocess.Popen([args.haproxy, "-db", "-f", args.haproxy_config],
                               env={**os.environ, **lb}, stdout=open(work / "haproxy.log", "w"),
                               stderr=subprocess.STDOUT)
    prometheus_port = free_port()
    (work / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "attnserve-trainer", "static_configs": [
                {"targets": [f"127.0.0.1:{trainer.ports['metrics_port']}"]}]},
            {"job_name": "attnserve-replicas", "static_configs": [
                {"targets": [f"127.0.0.1:{r.ports['metrics_port']}" for r in replicas]}]},
        ]}))
    prometheus = subprocess.Popen(
        [args.prometheus, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=open(work / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    return trainer, replicas, haproxy, prometheus, lb, f"http://127.0.0.1:{prometheus_port}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnserve", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--haproxy", default="/usr/sbin/haproxy")
    parser.add_argument("--haproxy-config", required=True)
    parser.add_argument("--prometheus", default="/usr/bin/prometheus")
    parser.add_argument("--adapter-rules", required=True, type=pathlib.Path)
    parser.add_argument("--work", required=True, type=pathlib.Path)
    parser.add_argument("--watch-s", type=float, default=1.0)
    # Client-visible errors allowed when a replica is killed (with the clients' retry policy and
    # the balancer's retries): the stated bound; the run prints what it saw.
    parser.add_argument("--max-kill-errors", type=int, default=3)
    parser.add_argument("--ramp-steps", default="1,2,4,8")
    parser.add_argument("--ramp-step-s", type=float, default=4)
    args = parser.parse_args()
    cpuinfo = open("/proc/cpuinfo").read()
    flags = set(re.search(r"^flags\s*:(.*)$", cpuinfo, re.M).group(1).split())
    # bench/harness.py's CPU classes.
    isa = ("amx" if "amx_bf16" in flags else "avx512-vnni" if "avx512_vnni" in flags
           else "skylake-avx512" if "avx512f" in flags else "avx2" if "avx2" in flags
           else "generic")
    summary = {"cpu": re.search(r"model name\s*:\s*(.*)", cpuinfo).group(1), "cpu_class": isa,
               "cores": os.cpu_count()}
    log(f"CPU: {summary['cpu']} (class {isa}), {summary['cores']} cores; every process on it")
    processes = []
    try:
        trainer, replicas, haproxy, prometheus, lb, prometheus_url = start_processes(args, args.work)
        processes = [trainer, *replicas]
        lb_grpc, lb_http = f"127.0.0.1:{lb['LB_GRPC_PORT']}", f"127.0.0.1:{lb['LB_HTTP_PORT']}"
        base_version, base = references_of(replicas[0])
        references = {base_version: base}
        check(wait_for(lambda: all(taking_calls(r, 0) or served_version(r) for r in replicas), 30),
              "3 replicas and the trainer serving")
        check(wait_for(lambda: served_version(type("lb", (), {"grpc": lb_grpc})) is not None, 30,
                       0.2), f"the balancer answers on {lb_grpc} (gRPC) and {lb_http} (HTTP)")
        load = Load(lb_grpc, lb_http, references, grpc_threads=3).start()
        time.sleep(2)
        phase_promotion(trainer, replicas, load, references, args.watch_s, summary)
        phase_kill(replicas[1], load, args.max_kill_errors, summary)
        phase_rolling(replicas, load, summary)
        phase_prometheus(prometheus_url, args.adapter_rules, summary)
        load.stop()
        calls, failed, wrong, _ = summarize(load.calls)
        summary["load"] = {"calls": calls, "failed": failed, "wrong": wrong,
                           "grpc": sum(1 for c in load.calls if c[2] == "grpc"),
                           "http": sum(1 for c in load.calls if c[2] == "http")}
        check(wrong == 0, f"the whole run: {calls} calls, {failed} failed, {wrong} wrong answers")
        phase_ramp(replicas, lb_grpc, lb_http, references, summary,
                   [int(s) for s in args.ramp_steps.split(",")], args.ramp_step_s)
    finally:
        for p in processes:
            if p.process is not None and p.process.poll() is None:
                p.signal(signal.SIGTERM)
        for p in processes:
            if p.process is not None:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.process.kill()
        for name in ("haproxy", "prometheus"):
            proc = locals().get(name)
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    summary["failures"] = FAILURES
    print("SUMMARY " + json.dumps(summary, default=str))
    print(f"replicas: {len(FAILURES)} failed checks")
    return 1 if FAILURES else 0


TOKEN = "replica-test-trainer-token"
START = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
