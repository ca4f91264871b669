#!/usr/bin/env python3
"""Validates deploy/k8s/kserve (run by deploy/test.sh) against KServe's published API without
a cluster.

KServe's CRD schemas reach this host through PyPI as its Python SDK: the `kserve` wheel's
kserve/models/*.py are generated from the CRDs' OpenAPI (each class lists its fields, their
JSON names and types, and which must be set), and the `kubernetes` wheel's
kubernetes/client/models/*.py do the same for the Kubernetes types the CRDs embed (containers,
probes, volumes, object metadata). Both wheels are downloaded with `pip download --no-deps`
(nothing is installed or imported: the model sources are read with `ast`). Every manifest is
walked against them, strictly: an unknown field, a wrong type or a missing required field is
a problem. Then what the schema does not see: the InferenceService's runtime, model format and
protocol exist in the ServingRuntime, the runtime speaks v2, its probes use the Open Inference
Protocol's health routes, the container's ports are KServe's (8080 REST, 8081 gRPC as h2c),
and attnserve gets the model directory KServe's storage initializer fills (/mnt/models).

Usage: check_kserve.py [--cache DIR] DIR
Exit status 0 if everything passes; each problem is printed as "file: kind/name: path: problem".
"""
import argparse
import ast
import pathlib
import re
import subprocess
import sys
import zipfile

import yaml

KSERVE_WHEEL = "kserve==0.15.2"
KUBERNETES_WHEEL = "kubernetes==31.0.0"
ROOTS = {("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
         ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService"}


def wheel(cache, requirement):
    name, version = requirement.split("==")
    found = list(cache.glob(f"{name}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--disable-pip-version-check", "--only-binary=:all:", "--dest",
                        str(cache), requirement], check=True)
        found = list(cache.glob(f"{name}-{version}-*.whl"))
    return found[0]


def load_models(path, prefix):
    """{class name: {"fields": {json name: type}, "required": {json names}}} from a wheel."""
    models = {}
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if not (name.startswith(prefix) and name.endswith(".py")):
                continue
            source = z.read(name).decode()
            for node in ast.parse(source).body:
                if not isinstance(node, ast.ClassDef):
                    continue
                values = {}
                for item in node.body:
                    if (isinstance(item, ast.Assign) and len(item.targets) == 1 and
                            isinstance(item.targets[0], ast.Name) and
                            item.targets[0].id in ("openapi_types", "attribute_map")):
                        values[item.targets[0].id] = ast.literal_eval(item.value)
                if len(values) != 2:
                    continue
                json_name = values["attribute_map"]
                required = {json_name[a] for a in re.findall(
                    r"Invalid value for `(\w+)`, must not be `None`",
                    ast.get_source_segment(source, node)) if a in json_name}
                models[node.name] = {
                    "fields": {json_name[a]: t for a, t in values["openapi_types"].items()},
                    "required": required}
    return models


def check_value(value, type_name, models, path, problems):
    if type_name == "object":
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            problems.append(f"{path}: must be a list")
            return
        for i, item in enumerate(value):
            check_value(item, type_name[5:-1], models, f"{path}[{i}]", problems)
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            problems.append(f"{path}: must be a map")
            return
        inner = type_name[type_name.index(",") + 1:-1].strip()
        for key, item in value.items():
            check_value(item, inner, models, f"{path}.{key}", problems)
        return
    simple = {"str": str, "datetime": str, "date": str, "bool": bool, "float": (int, float),
              "int": int}
    if type_name in simple:
        if not isinstance(value, simple[type_name]) or (type_name == "int" and
                                                        isinstance(value, bool)):
            problems.append(f"{path}: must be {type_name}, not {type(value).__name__} "
                            f"({str(value)[:40]})")
        return
    model = models.get(type_name)
    if model is None:
        problems.append(f"{path}: no schema for type {type_name}")
        return
    if not isinstance(value, dict):
        problems.append(f"{path}: must be an object ({type_name})")
        return
    for key, item in value.items():
        if key not in model["fields"]:
            problems.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        check_value(item, model["fields"][key], models, f"{path}.{key}", problems)
    for key in sorted(model["required"] - set(value)):
        problems.append(f"{path}.{key}: required by {type_name}")


def cross_check(runtimes, services, problems):
    for where, runtime in runtimes.items():
        spec = runtime.get("spec", {})
        if "v2" not in spec.get("protocolVersions", []):
            problems.append(f"{where}: protocolVersions must include v2 (attnserve speaks OIP)")
        for container in spec.get("containers", []):
            env = {e.get("name"): e.get("value") for e in container.get("env", [])}
            if env.get("ATTNSERVE_MODEL_DIR") != "/mnt/models":
                problems.append(f"{where}: ATTNSERVE_MODEL_DIR must be /mnt/models, where "
                                "KServe's storage initializer puts the model")
            if (env.get("ATTNSERVE_HTTP_PORT"), env.get("ATTNSERVE_PORT")) != ("8080", "8081"):
                problems.append(f"{where}: attnserve must serve REST on 8080 and gRPC on 8081")
            ports = {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}
            if ports.get("h2c") != 8081:
                problems.append(f"{where}: the gRPC port is KServe's h2c port 8081")
            for probe, route in (("readinessProbe", "/v2/health/ready"),
                                 ("livenessProbe", "/v2/health/live")):
                get = (container.get(probe) or {}).get("httpGet") or {}
                if get.get("path") != route or get.get("port") != 8080:
                    problems.append(f"{where}: {probe} must GET {route} on 8080")
    for where, service in services.items():
        model = (service.get("spec", {}).get("predictor") or {}).get("model") or {}
        runtime = next((r for r in runtimes.values()
                        if r["metadata"]["name"] == model.get("runtime")), None)
        if runtime is None:
            problems.append(f"{where}: runtime {model.get('runtime')} is no ServingRuntime here")
            continue
        formats = {f["name"] for f in runtime["spec"].get("supportedModelFormats", [])}
        if (model.get("modelFormat") or {}).get("name") not in formats:
            problems.append(f"{where}: modelFormat is not one of the runtime's {sorted(formats)}")
        if model.get("protocolVersion") not in runtime["spec"].get("protocolVersions", []):
            problems.append(f"{where}: protocolVersion {model.get('protocolVersion')} is not "
                            "the runtime's")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--cache", type=pathlib.Path,
                        default=pathlib.Path.home() / ".cache" / "attnserve-kserve-wheels")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    models = load_models(wheel(args.cache, KUBERNETES_WHEEL), "kubernetes/client/models/")
    models.update(load_models(wheel(args.cache, KSERVE_WHEEL), "kserve/models/"))
    problems, runtimes, services, count = [], {}, {}, 0
    for path in sorted(args.directory.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is None:
                continue
            count += 1
            key = (document.get("apiVersion"), document.get("kind"))
            where = f"{path.name}: {document.get('kind')}/{document.get('metadata', {}).get('name')}"
            if key not in ROOTS:
                problems.append(f"{where}: not a KServe ServingRuntime or InferenceService "
                                f"({key[0]} {key[1]})")
                continue
            check_value(document, ROOTS[key], models, where, problems)
            (runtimes if key[1] == "ServingRuntime" else services)[where] = document
    cross_check(runtimes, services, problems)
    for problem in problems:
        print(problem)
    print(f"{count} KServe manifests checked against {KSERVE_WHEEL}'s and {KUBERNETES_WHEEL}'s "
          f"generated models ({len(models)} types): {len(problems)} problem(s)")
    return 1 if problems or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
