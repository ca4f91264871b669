#!/usr/bin/env python3
"""Validates deploy/k8s without a cluster (run by deploy/test.sh, in a venv with
kubernetes-validate and PyYAML):

1. every built-in resource against the Kubernetes OpenAPI schema of --kubernetes-version, in
   strict mode (unknown fields are errors), with kubernetes-validate;
2. the Prometheus Operator PodMonitor/ServiceMonitor, whose CRD schema is not bundled, for the
   fields the operator requires;
3. what no schema sees: selectors that match pod labels, probe/monitor ports that exist, the HPA
   target and its custom metrics (each exposed by a prometheus-adapter rule whose shape is
   checked), claims and secrets that are defined or documented, the grace period covering the
   drain, the non-root user matching the Dockerfile's USER, kustomization listing every file.

Usage: check_manifests.py [--kubernetes-version 1.29.0] [--dockerfile Dockerfile] DIR
Exit status 0 if everything passes; each problem is printed as "file: kind/name: problem".
"""
import argparse
import pathlib
import re
import sys

import kubernetes_validate
import yaml

# Created by the operator (`kubectl create secret ...` in the README), not by these files.
EXTERNAL_SECRETS = {"attnserve-trainer-token"}
MONITOR_KINDS = {"PodMonitor", "ServiceMonitor"}


def load(directory):
    documents = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                documents.append((path.name, document))
    return documents


def name_of(document):
    return f"{document.get('kind')}/{document.get('metadata', {}).get('name')}"


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_monitor(document, problems, where):
    if document.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"{where}: apiVersion must be monitoring.coreos.com/v1")
    spec = document.get("spec") or {}
    if not (spec.get("selector") or {}).get("matchLabels"):
        problems.append(f"{where}: spec.selector.matchLabels is required")
    key = "podMetricsEndpoints" if document["kind"] == "PodMonitor" else "endpoints"
    endpoints = spec.get(key)
    if not isinstance(endpoints, list) or not endpoints:
        problems.append(f"{where}: spec.{key} must be a non-empty list")
        return
    allowed = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels",
               "relabelings", "metricRelabelings", "targetPort", "params"}
    for endpoint in endpoints:
        unknown = set(endpoint) - allowed
        if unknown:
            problems.append(f"{where}: unknown endpoint fields {sorted(unknown)}")
        if "port" not in endpoint:
            problems.append(f"{where}: every endpoint needs a named port")
        for duration in ("interval", "scrapeTimeout"):
            if duration in endpoint and not re.fullmatch(r"\d+(ms|s|m|h)", endpoint[duration]):
                problems.append(f"{where}: {duration} '{endpoint[duration]}' is not a duration")


ADAPTER_RULE_KEYS = {"seriesQuery", "seriesFilters", "resources", "name", "metricsQuery"}


def adapter_metrics(document, problems, where):
    """The custom metrics a prometheus-adapter rules ConfigMap exposes; checks its rules' shape
    (the adapter's config format: rules[].seriesQuery/resources/name/metricsQuery)."""
    try:
        config = yaml.safe_load((document.get("data") or {}).get("config.yaml", ""))
    except yaml.YAMLError as error:
        problems.append(f"{where}: config.yaml is not YAML: {error}")
        return set()
    rules = (config or {}).get("rules")
    if not isinstance(rules, list) or not rules:
        problems.append(f"{where}: config.yaml needs a non-empty rules list")
        return set()
    names = set()
    for i, rule in enumerate(rules):
        rwhere = f"{where}: rules[{i}]"
        unknown = set(rule) - ADAPTER_RULE_KEYS
        if unknown:
            problems.append(f"{rwhere}: unknown fields {sorted(unknown)}")
        series = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule.get("seriesQuery", ""))
        if not series:
            problems.append(f"{rwhere}: seriesQuery must be a metric with label matchers")
            continue
        overrides = (rule.get("resources") or {}).get("overrides") or {}
        if {v.get("resource") for v in overrides.values()} != {"namespace", "pod"}:
            problems.append(f"{rwhere}: resources.overrides must map namespace and pod")
        query = rule.get("metricsQuery", "")
        for part in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            if part not in query:
                problems.append(f"{rwhere}: metricsQuery lacks {part}")
        name = rule.get("name") or {}
        if name.get("matches") and not re.search(name["matches"], series.group(1)):
            problems.append(f"{rwhere}: name.matches does not match {series.group(1)}")
        names.add(name.get("as") or series.group(1))
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--kubernetes-version", default="1.29.0")
    parser.add_argument("--dockerfile", type=pathlib.Path)
    args = parser.parse_args()

    documents = load(args.directory)
    problems = []
    if not documents:
        problems.append(f"{args.directory}: no manifests")

    # 1 + 2: schemas.
    for filename, document in documents:
        where = f"{filename}: {name_of(document)}"
        if document.get("kind") in MONITOR_KINDS:
            check_monitor(document, problems, where)
            continue
        try:
            kubernetes_validate.validate(document, args.kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            problems.append(f"{where}: {path}: {error.message}")
        except Exception as error:  # unknown kind or version: also a failure here
            problems.append(f"{where}: {error}")

    # The custom metrics prometheus-adapter's rules expose (prometheus-adapter.yaml).
    custom_metrics = set()
    for filename, document in documents:
        if document.get("kind") == "ConfigMap" and "config.yaml" in (document.get("data") or {}):
            custom_metrics |= adapter_metrics(document, problems,
                                              f"{filename}: {name_of(document)}")

    # 3: consistency between resources.
    deployments = [d for _, d in documents if d.get("kind") == "Deployment"]
    pod_labels = [d["spec"]["template"]["metadata"].get("labels", {}) for d in deployments]
    claims = {d["metadata"]["name"] for _, d in documents
              if d.get("kind") == "PersistentVolumeClaim"}
    secrets = EXTERNAL_SECRETS | {d["metadata"]["name"] for _, d in documents
                                  if d.get("kind") == "Secret"}
    dockerfile_uid = None
    if args.dockerfile:
        users = re.findall(r"^USER\s+(\d+)", args.dockerfile.read_text(), re.MULTILINE)
        dockerfile_uid = int(users[-1]) if users else None
        if dockerfile_uid is None:
            problems.append(f"{args.dockerfile}: no numeric USER in the final stage")

    for filename, document in documents:
        where = f"{filename}: {name_of(document)}"
        kind = document.get("kind")
        spec = document.get("spec") or {}
        if kind == "Deployment":
            template = spec["template"]
            if not matches(spec["selector"].get("matchLabels"), template["metadata"]["labels"]):
                problems.append(f"{where}: selector does not match the pod template's labels")
            pod = template["spec"]
            security = pod.get("securityContext") or {}
            if not security.get("runAsNonRoot"):
                problems.append(f"{where}: pod securityContext.runAsNonRoot must be true")
            if dockerfile_uid is not None and security.get("runAsUser") != dockerfile_uid:
                problems.append(f"{where}: runAsUser {security.get('runAsUser')} differs from "
                                f"the image's USER {dockerfile_uid}")
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for volume in volumes.values():
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if claim is not None and claim not in claims:
                    problems.append(f"{where}: volume {volume['name']}: claim {claim} undefined")
                secret = (volume.get("secret") or {}).get("secretName")
                if secret is not None and secret not in secrets:
                    problems.append(f"{where}: volume {volume['name']}: secret {secret} unknown")
            for container in pod["containers"]:
                cwhere = f"{where}: container {container['name']}"
                ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
                for mount in container.get("volumeMounts", []):
                    if mount["name"] not in volumes:
                        problems.append(f"{cwhere}: mount of undefined volume {mount['name']}")
                for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                    probe = container.get(probe_name)
                    if probe is None:
                        problems.append(f"{cwhere}: no {probe_name}")
                        continue
                    grpc = probe.get("grpc")
                    if grpc is None:
                        problems.append(f"{cwhere}: {probe_name} should use the gRPC health "
                                        "service")
                    elif grpc["port"] not in ports.values():
                        problems.append(f"{cwhere}: {probe_name} port {grpc['port']} not exposed")
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                drain = float(env.get("ATTNSERVE_DRAIN_TIMEOUT_S") or 30)
                pre_stop = 0.0
                command = (((container.get("lifecycle") or {}).get("preStop") or {})
                           .get("exec") or {}).get("command") or []
                if len(command) == 2 and command[0] == "sleep":
                    pre_stop = float(command[1])
                grace = pod.get("terminationGracePeriodSeconds", 30)
                if grace < drain + pre_stop:
                    problems.append(f"{cwhere}: terminationGracePeriodSeconds {grace} < preStop "
                                    f"{pre_stop:g} s + drain {drain:g} s")
                if "memory" not in (container.get("resources") or {}).get("limits", {}):
                    problems.append(f"{cwhere}: no memory limit")
                csec = container.get("securityContext") or {}
                if csec.get("allowPrivilegeEscalation") is not False:
                    problems.append(f"{cwhere}: allowPrivilegeEscalation must be false")
        elif kind == "Service":
            selector = spec.get("selector")
            targets = [d for d, labels in zip(deployments, pod_labels) if matches(selector, labels)]
            if not targets:
                problems.append(f"{where}: selector {selector} matches no Deployment's pods")
            for port in spec.get("ports", []):
                target = port.get("targetPort", port["port"])
                for deployment in targets:
                    names = {p.get("name") for c in deployment["spec"]["template"]["spec"]
                             ["containers"] for p in c.get("ports", [])}
                    numbers = {p["containerPort"] for c in deployment["spec"]["template"]["spec"]
                               ["containers"] for p in c.get("ports", [])}
                    if target not in names and target not in numbers:
                        problems.append(f"{where}: targetPort {target} not a port of "
                                        f"{name_of(deployment)}")
        elif kind in ("PodDisruptionBudget",) or kind in MONITOR_KINDS:
            selector = (spec.get("selector") or {}).get("matchLabels")
            targets = [d for d, labels in zip(deployments, pod_labels) if matches(selector, labels)]
            if not targets:
                problems.append(f"{where}: selector {selector} matches no Deployment's pods")
            if kind == "PodMonitor":
                for endpoint in spec.get("podMetricsEndpoints", []):
                    for deployment in targets:
                        names = {p.get("name") for c in deployment["spec"]["template"]["spec"]
                                 ["containers"] for p in c.get("ports", [])}
                        if endpoint.get("port") not in names:
                            problems.append(f"{where}: port {endpoint.get('port')} is not a "
                                            f"named port of {name_of(deployment)}")
        elif kind == "HorizontalPodAutoscaler":
            ref = spec["scaleTargetRef"]
            if not any(d["metadata"]["name"] == ref["name"] and ref["kind"] == "Deployment"
                       for d in deployments):
                problems.append(f"{where}: scaleTargetRef {ref['kind']}/{ref['name']} undefined")
            if spec.get("minReplicas", 1) > spec["maxReplicas"]:
                problems.append(f"{where}: minReplicas > maxReplicas")
            for metric in spec.get("metrics", []):
                if metric.get("type") == "Pods":
                    name = metric["pods"]["metric"]["name"]
                    if name not in custom_metrics:
                        problems.append(f"{where}: Pods metric {name} is exposed by no "
                                        f"prometheus-adapter rule (have {sorted(custom_metrics)})")

    kustomization = args.directory / "kustomization.yaml"
    if kustomization.exists():
        listed = set(yaml.safe_load(kustomization.read_text()).get("resources", []))
        present = {p.name for p in args.directory.glob("*.yaml")} - {"kustomization.yaml"}
        for missing in sorted(present - listed):
            problems.append(f"kustomization.yaml: does not list {missing}")
        for extra in sorted(listed - present):
            problems.append(f"kustomization.yaml: lists missing file {extra}")

    for problem in problems:
        print(problem)
    kinds = sorted({name_of(d) for _, d in documents})
    print(f"{len(documents)} manifests ({', '.join(kinds)}) checked against Kubernetes "
          f"{args.kubernetes_version}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
