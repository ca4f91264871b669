#!/usr/bin/env python3
"""Which tests give a sanitizer new code to see: line coverage per group of ctest tests.

Builds (or reuses) a coverage tree (g++ --coverage at -O1, the sanitizer trees' optimisation
level, no sanitizer), runs each group of tests with its own GCOV_PREFIX (the servers the
integration tests start write there too, on their SIGTERM exit), and prints per group the lines
of the project's own code (engine/, server/, client/) it executes and how many of them no other
group executes: a slow test whose unique count is 0 only repeats what the rest of the suite
already shows the sanitizer (tests/reliability/README.md, "Sanitizers: which tests").

Groups: each test with the label `integration` is its own group; the others (label `unit`) form
the group `unit`, except those named with --split (a ctest regex: each matching test becomes its
own group). Tests matching --exclude are not run; those named with --tiny-model run on
fuzz/tiny_model, as in the sanitizer jobs.

Usage:
  tests/reliability/sanitizer_coverage.py [--build-dir build-cov] [--no-build] [--jobs 2]
      [--split REGEX]... [--exclude REGEX] [--tiny-model NAME]... [--json OUT] [--out DIR]
"""
import argparse
import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OWN_CODE = ("engine/", "server/", "client/")


def run(cmd, **kwargs):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=False, **kwargs)


def configure_and_build(build, model_dir, mpnet_dir, venv, jobs):
    if not os.path.exists(os.path.join(build, "build.ninja")):
        launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else []
        subprocess.run(["cmake", "-G", "Ninja", "-S", ROOT, "-B", build,
                        "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG",
                        "-DCMAKE_CXX_FLAGS=--coverage", "-DCMAKE_EXE_LINKER_FLAGS=--coverage",
                        "-DCMAKE_SHARED_LINKER_FLAGS=--coverage",
                        f"-DATTN_DEFAULT_MODEL_DIR={model_dir}",
                        f"-DATTN_MPNET_MODEL_DIR={mpnet_dir}", f"-DATTN_TEST_VENV={venv}"]
                       + launcher, check=True)
    # The executables the ASan job builds (scripts/sanitize.sh): not the benchmarks, the golden
    # or the reliability tests.
    targets = subprocess.run(["ninja", "-C", build, "-t", "targets", "all"], check=True,
                             capture_output=True, text=True).stdout
    wanted = []
    for line in targets.splitlines():
        m = re.match(r"^(\S+): CXX_EXECUTABLE_LINKER", line)
        if not m:
            continue
        t = m.group(1)
        if re.match(r"^(bench|tests/reliability)/|^tests/golden_tests$|^engine/attn-embed$", t):
            continue
        wanted.append(t)
    subprocess.run(["ninja", "-C", build, f"-j{jobs}"] + wanted, check=True)


def list_tests(build, labels):
    out = subprocess.run(["ctest", "--test-dir", build, "-N", "-L", labels],
                         check=True, capture_output=True, text=True).stdout
    return [m.group(1) for m in re.finditer(r"^\s*Test\s+#\d+: (\S+)$", out, re.M)]


def labels_of(build, name):
    out = subprocess.run(["ctest", "--test-dir", build, "-N", "-L", "integration",
                          "-R", "^" + re.escape(name) + "$"],
                         check=True, capture_output=True, text=True).stdout
    return "integration" if "Total Tests: 1" in out else "unit"


def run_group(build, names, prefix, jobs, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    print(f"== {len(names)} test(s) -> {prefix}", flush=True)
    env["GCOV_PREFIX"] = prefix
    env["GCOV_PREFIX_STRIP"] = str(len([p for p in build.split("/") if p]))
    # One regex for the group; ctest -R takes it whole.
    regex = "^(" + "|".join(re.escape(n) for n in names) + ")$"
    r = run(["ctest", "--test-dir", build, "-j", str(jobs), "-R", regex, "--output-on-failure"],
            env=env, stdout=subprocess.DEVNULL)
    return r.returncode


def covered_lines(build, prefix):
    """{(source, line)} with a nonzero count, for the project's own sources."""
    lines = set()
    gcdas = []
    for d, _, files in os.walk(prefix):
        gcdas += [os.path.join(d, f) for f in files if f.endswith(".gcda")]
    pairs = []
    for gcda in gcdas:
        rel = os.path.relpath(gcda, prefix)
        gcno = os.path.join(build, rel[:-5] + ".gcno")
        if not os.path.exists(gcno):
            continue
        link = os.path.join(prefix, rel[:-5] + ".gcno")
        if not os.path.exists(link):
            os.symlink(gcno, link)
        pairs.append(gcda)
    with tempfile.TemporaryDirectory() as work:
        for i in range(0, len(pairs), 64):
            r = subprocess.run(["gcov", "-j", "-t"] + pairs[i:i + 64], cwd=work,
                               capture_output=True, text=True)
            for doc in r.stdout.splitlines():
                doc = doc.strip()
                if not doc.startswith("{"):
                    continue
                data = json.loads(doc)
                for f in data.get("files", []):
                    path = os.path.normpath(os.path.join(build, f["file"]))
                    rel_src = os.path.relpath(path, ROOT)
                    if not rel_src.startswith(OWN_CODE):
                        continue
                    for ln in f["lines"]:
                        if ln["count"] > 0:
                            lines.add((rel_src, ln["line_number"]))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-cov"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--split", action="append", default=[])
    ap.add_argument("--exclude", default="")
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models/all-MiniLM-L6-v2"))
    ap.add_argument("--mpnet-model-dir", default=os.path.join(ROOT, "models/all-mpnet-base-v2"))
    ap.add_argument("--venv", default=os.path.join(ROOT, ".venv-test"))
    ap.add_argument("--tiny-model", action="append", default=[],
                    help="run this test on fuzz/tiny_model, as the sanitizer jobs do")
    ap.add_argument("--json", help="write the per-group line sets' sizes and unique lines here")
    ap.add_argument("--out", default="", help="keep the gcda trees here (default: a temp dir)")
    args = ap.parse_args()
    build = os.path.abspath(args.build_dir)
    if not args.no_build:
        configure_and_build(build, args.model_dir, args.mpnet_model_dir, args.venv, args.jobs)

    tests = list_tests(build, "unit|integration")
    if args.exclude:
        tests = [t for t in tests if not re.search(args.exclude, t)]
    integration = set(list_tests(build, "integration"))
    groups = collections.OrderedDict()
    for t in tests:
        if t in integration or any(re.search(s, t) for s in args.split):
            groups[t] = [t]
        else:
            groups.setdefault("unit", []).append(t)

    out = args.out or tempfile.mkdtemp(prefix="attn-coverage-")
    env_extra = {"OMP_NUM_THREADS": "1"}
    results = {}
    for name, names in groups.items():
        prefix = os.path.join(out, re.sub(r"[^\w.-]", "_", name))
        shutil.rmtree(prefix, ignore_errors=True)
        os.makedirs(prefix)
        env = dict(env_extra)
        if name in args.tiny_model:
            env["ATTN_TEST_MODEL_DIR"] = os.path.join(ROOT, "fuzz/tiny_model")
        status = run_group(build, names, prefix, args.jobs, env)
        results[name] = {"status": status, "lines": covered_lines(build, prefix)}
        print(f"{name}: exit {status}, {len(results[name]['lines'])} lines", flush=True)

    report = {}
    for name, r in results.items():
        others = set()
        for other, o in results.items():
            if other != name:
                others |= o["lines"]
        unique = r["lines"] - others
        by_file = collections.Counter(f for f, _ in unique)
        report[name] = {"status": r["status"], "lines": len(r["lines"]), "unique": len(unique),
                        "unique_by_file": dict(by_file.most_common()),
                        "unique_lines": sorted(f"{f}:{n}" for f, n in unique)}
    print(f"\n{'group':58} {'lines':>7} {'unique':>7}  unique lines by file")
    for name, r in sorted(report.items(), key=lambda kv: kv[1]["unique"]):
        files = ", ".join(f"{f} {n}" for f, n in list(r["unique_by_file"].items())[:4])
        print(f"{name:58} {r['lines']:7} {r['unique']:7}  {files}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
