#!/usr/bin/env python3
"""Runs the README's examples against real attnserve servers and compares what they print with
what the README shows, numbers masked (ctest readme_test; issue 31), so README and product
cannot drift apart.

What runs, by the fence of each block and an HTML comment on the line before it (invisible on a
rendered page):

  ```console   run: each `$ ` line is a command (a line ending in `\\` continues it); the lines up
               to the next `$ ` are what it prints (stdout and stderr together).
  ```python    run: the blocks of one server run in one interpreter, in README order, sharing
               their variables; comment lines at column 0 (`# ...`) right after a statement
               are what it prints; a comment after a blank line (or first) is a comment.
  other fences (sh, plain ```): shown, not run: installation, deployment, long jobs.

  <!-- doctest: skip REASON -->          this console/python block is not run.
  <!-- doctest: server=NAME [trainer] [apikey] -->
                                         run against server NAME, started for the first block
                                         naming it and shared by the next ones (default: main,
                                         a plain server). `trainer`: the server has a trainer
                                         token (the file trainer.token in its directory, and
                                         $ATTNSERVE_TOKEN) and a fresh model store, store/.
                                         `apikey`: the server needs the API key in the file
                                         api.key of its directory (--api-key-file).

Matching: any number matches any number (a README shows one run's timings, ids and scores);
`...` inside a line matches anything, a line of only `...` any number of lines; runs of blanks
count as one. Commands and code run in the server's own directory, where examples/ is this
checkout's, `build/client/attnctl`, `attnctl` and `attnserve` are the build's, and
localhost:50051, :8080 and :9464 (the default ports) are the test server's. Names the server
makes (ft-..., job-...) are learned where the README shows them in output and replaced in later
commands.

Usage: readme_test.py --readme README.md --attnserve build/server/attnserve
           --attnctl build/client/attnctl --model-dir DIR [--block LINE ...] [--keep]
"""
import argparse
import contextlib
import difflib
import fcntl
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

TIME_SCALE = max(1.0, float(os.environ.get("ATTN_TEST_TIME_SCALE", "1") or 1))
DEFAULT_PORTS = {"50051": "grpc_port", "8080": "http_port", "9464": "metrics_port"}
NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
NAME = r"\b(?:ft|job)-[0-9A-Za-z]+(?:-[0-9A-Za-z]+)*"
MARKER = re.compile(r"^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$")


class TerminalText(io.StringIO):
    """Captured output that, like a UTF-8 terminal, takes any character (tqdm draws its bar in
    block characters only where the output's encoding can show them)."""

    encoding = "utf-8"


class Block:
    def __init__(self, kind, line, lines, marker):
        self.kind, self.line, self.lines = kind, line, lines  # line: the fence's, 1-based
        self.skip = marker.startswith("skip")
        words = marker.split()
        self.server = next((w[7:] for w in words if w.startswith("server=")), "main")
        self.trainer = "trainer" in words
        self.apikey = "apikey" in words


def read_blocks(readme):
    """Every fenced block: its info string, first line, content (de-indented), marker."""
    blocks, lines = [], open(readme, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, kind = len(fence.group(1)), fence.group(2)
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = MARKER.match(lines[j]) if j >= 0 else None
        end = i + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        content = [l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 1:end]]
        blocks.append(Block(kind, i + 1, content, marker.group(1) if marker else ""))
        i = end + 1
    return blocks


def line_pattern(expected):
    """A README output line as a regex: numbers, `...` and blank runs are wildcards."""
    out, pos = [], 0
    for m in re.finditer(r"(\.\.\.)|(%s)|(\s+)" % NUMBER, expected):
        out.append(re.escape(expected[pos:m.start()]))
        out.append(".*" if m.group(1) else NUMBER if m.group(2) else r"\s+")
        pos = m.end()
    out.append(re.escape(expected[pos:]))
    return re.compile("".join(out))


def normalised(text):
    """Printed text as lines: what a terminal shows after carriage returns, no trailing blanks."""
    lines = [line.split("\r")[-1].rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def match_lines(expected, actual):
    """An alignment [(expected index, actual index)] if `actual` matches `expected`, else None."""
    expected = [e.rstrip() for e in expected]
    while expected and not expected[-1]:
        expected.pop()
    patterns = [None if e.strip() == "..." else line_pattern(e.strip()) for e in expected]
    memo = {}

    def solve(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(patterns):
            result = [] if j == len(actual) else None
        elif patterns[i] is None:
            result = solve(i + 1, j)
            if result is None and j < len(actual):
                result = solve(i, j + 1)
        elif j < len(actual) and patterns[i].fullmatch(actual[j].strip()):
            rest = solve(i + 1, j + 1)
            result = None if rest is None else [(i, j)] + rest
        else:
            result = None
        memo[(i, j)] = result
        return result

    sys.setrecursionlimit(max(10000, 4 * (len(patterns) + len(actual)) + 100))
    return solve(0, 0)


class Server:
    """One attnserve for a group of blocks, in its own directory."""

    def __init__(self, name, trainer, apikey, args, work):
        self.name, self.trainer = name, trainer
        self.dir = os.path.join(work, name)
        os.makedirs(os.path.join(self.dir, "bin"))
        os.makedirs(os.path.join(self.dir, "build", "client"))
        os.makedirs(os.path.join(self.dir, "build", "server"))
        os.symlink(os.path.join(args.root, "examples"), os.path.join(self.dir, "examples"))
        for sub, binary in (("client", "attnctl"), ("server", "attnserve")):
            path = getattr(args, binary)
            os.symlink(path, os.path.join(self.dir, "bin", binary))
            os.symlink(path, os.path.join(self.dir, "build", sub, binary))
        self.token = ""
        flags = []
        if trainer:
            self.token = "readme-doctest-" + name
            with open(os.path.join(self.dir, "trainer.token"), "w") as f:
                f.write(self.token + "\n")
            flags = ["--trainer-token-file", "trainer.token", "--model-store", "store",
                     "--trainer-threads", "1"]
        if apikey:
            with open(os.path.join(self.dir, "api.key"), "w") as f:
                f.write("readme-doctest-key-" + name + "\n")
            flags += ["--api-key-file", "api.key"]
        ready = os.path.join(self.dir, "ready.json")
        self.log_path = os.path.join(self.dir, "attnserve.log")
        self.process = subprocess.Popen(
            [args.attnserve, "--model-dir", args.model_dir,
             "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--metrics-port", "0",
             "--ready-file", ready] + flags,
            cwd=self.dir, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.time() + 120 * TIME_SCALE
        self.ports = None
        while time.time() < deadline and self.process.poll() is None:
            try:
                with open(ready) as f:
                    self.ports = json.load(f)
                break
            except (OSError, ValueError):
                time.sleep(0.1)
        if self.ports is None:
            raise RuntimeError("server %s did not start:\n%s" % (name, self.log()))
        self.env = dict(os.environ)
        for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
            self.env.pop(proxy, None)
        # Standard output line-buffered, as on a terminal, so that it interleaves with standard
        # error in the order a user sees (a pipe would hold stdout until the program ends).
        stdbuf = "/usr/libexec/coreutils/libstdbuf.so"
        if os.path.exists(stdbuf):
            self.env.update({"LD_PRELOAD": stdbuf, "_STDBUF_O": "L"})
        self.env.update({"PATH": os.path.join(self.dir, "bin") + os.pathsep + self.env["PATH"],
                         "ATTNSERVE_ADDR": "127.0.0.1:%d" % self.ports["grpc_port"],
                         "NO_PROXY": "*", "no_proxy": "*", "LC_ALL": "C.UTF-8"})
        self.env.pop("ATTNSERVE_TOKEN", None)
        if trainer:
            self.env["ATTNSERVE_TOKEN"] = self.token
        self.namespace = {"__name__": "__readme__"}

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-6000:]

    def local(self, text):
        """The default ports replaced by this server's."""
        def port(m):
            return "127.0.0.1:%d" % self.ports[DEFAULT_PORTS[m.group(2)]]
        return re.sub(r"\b(localhost|127\.0\.0\.1|0\.0\.0\.0):(50051|8080|9464)\b", port, text)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30 * TIME_SCALE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def python_output(lines):
    """The printed output a python block shows: the comment lines at column 0 that follow a
    statement directly (a comment run after a blank line, or at the top, explains)."""
    output, after_code = [], False
    for line in lines:
        if line.startswith("#"):
            if after_code:
                output.append(line[2:] if line.startswith("# ") else line[1:])
        else:
            after_code = bool(line.strip())
    return output


def console_steps(block):
    """(command, its README line, expected lines) for each `$ ` command of a console block."""
    steps, i, lines = [], 0, block.lines
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1  # text before the first command: shown, not checked
            continue
        start, command = i, lines[i][2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command += "\n" + lines[i]  # bash reads the backslash-newline as it is
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        steps.append((command, block.line + 1 + start, expected))
    return steps


class Run:
    def __init__(self, args):
        self.args, self.failures, self.names, self.servers = args, [], {}, {}
        self.checked = 0

    def server(self, block):
        if block.server not in self.servers:
            self.servers[block.server] = Server(block.server, block.trainer, block.apikey, self.args,
                                                self.args.work)
        return self.servers[block.server]

    def substitute(self, text):
        for readme_name, real in self.names.items():
            text = text.replace(readme_name, real)
        return text

    def learn(self, expected, actual, alignment):
        # In a matched line the README's names come first in the same order (a `...` may elide
        # later ones).
        for i, j in alignment:
            shown, got = re.findall(NAME, expected[i]), re.findall(NAME, actual[j])
            self.names.update({a: b for a, b in zip(shown, got) if a != b})

    def compare(self, where, what, expected, output, server):
        actual = normalised(output)
        alignment = match_lines(expected, actual)
        self.checked += 1
        if alignment is not None:
            self.learn(expected, actual, alignment)
            print("ok    %s: %s" % (where, what.split("\n")[0][:100]))
            return
        diff = "\n".join(difflib.unified_diff(
            [e.rstrip() for e in expected], actual, "README (numbers masked, ... elides)",
            "printed", lineterm="", n=2))
        self.failures.append("%s: %s\n%s" % (where, what, diff))
        print("FAIL  %s: %s\n%s\n" % (where, what.split("\n")[0][:100], diff))

    def console(self, block):
        server = self.server(block)
        for command, line, expected in console_steps(block):
            where = "%s:%d" % (self.args.readme_name, line)
            real = server.local(self.substitute(command))
            try:
                done = subprocess.run(["bash", "-c", real], cwd=server.dir, env=server.env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      timeout=600 * TIME_SCALE)
                output = done.stdout.decode("utf-8", "replace")
            except subprocess.TimeoutExpired as e:
                output = "(timed out after %.0f s)\n%s" % (e.timeout, (e.stdout or b"").decode())
            self.compare(where, "$ " + command, expected, output, server)

    def python(self, block):
        server = self.server(block)
        code = server.local("\n".join(block.lines))
        expected = python_output(block.lines)
        where = "%s:%d" % (self.args.readme_name, block.line)
        captured = TerminalText()
        cwd, environ = os.getcwd(), dict(os.environ)
        os.chdir(server.dir)
        # The block sees the server's environment ($ATTNSERVE_ADDR, $ATTNSERVE_TOKEN), as a
        # shell that ran the console blocks would.
        os.environ.clear()
        os.environ.update({k: v for k, v in server.env.items() if k not in ("LD_PRELOAD",
                                                                              "_STDBUF_O")})
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                exec(compile(code, where, "exec"), server.namespace)
        except BaseException:  # the README's output never shows a traceback: a failure
            captured.write(traceback.format_exc())
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(environ)
        self.compare(where, "python block (%d lines)" % len(block.lines), expected,
                     captured.getvalue(), server)

    def run(self, blocks):
        chosen = [b for b in blocks if b.kind in ("console", "python") and not b.skip
                  and (not self.args.block or b.line in self.args.block)]
        skipped = [b for b in blocks if b.kind in ("console", "python") and b.skip]
        last_use = {b.server: b.line for b in chosen}
        for block in chosen:
            try:
                (self.console if block.kind == "console" else self.python)(block)
            except Exception as e:  # a server that does not start, a broken block
                self.failures.append("%s:%d: %s" % (self.args.readme_name, block.line, e))
                print("FAIL  %s:%d: %s" % (self.args.readme_name, block.line, e))
            if last_use[block.server] == block.line and block.server in self.servers:
                server = self.servers.pop(block.server)
                if self.failures:
                    print("--- attnserve log of server %s ---\n%s" % (server.name, server.log()))
                server.stop()
        for server in self.servers.values():
            server.stop()
        print("\n%d README examples checked in %d blocks, %d failed; %d blocks skipped by their "
              "marker" % (self.checked, len(chosen), len(self.failures), len(skipped)))
        for failure in self.failures:
            print("\n" + failure)
        return not self.failures and self.checked > 0


def install_client(root, target):
    """The checkout's client/python into `target` (not the shared venv), as pip builds it."""
    lock = open(os.path.join(tempfile.gettempdir(), "attnserve-python-client-install.lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
                        "--target", target, os.path.join(root, "client", "python")], check=True)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
    sys.path.insert(0, target)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readme", required=True)
    parser.add_argument("--attnserve", required=True, help="the server binary")
    parser.add_argument("--attnctl", required=True, help="the client binary")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--block", type=int, action="append",
                        help="run only the block whose fence is on this README line")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    args.readme = os.path.abspath(args.readme)
    args.readme_name = os.path.basename(args.readme)
    args.root = os.path.dirname(args.readme)
    args.attnserve = os.path.abspath(args.attnserve)
    args.attnctl = os.path.abspath(args.attnctl)
    args.model_dir = os.path.abspath(args.model_dir)
    args.work = tempfile.mkdtemp(prefix="attnserve-readme-")
    try:
        blocks = read_blocks(args.readme)
        if any(b.kind == "python" and not b.skip for b in blocks):
            install_client(args.root, os.path.join(args.work, "python"))
        ok = Run(args).run(blocks)
    finally:
        if args.keep:
            print("work directory kept: " + args.work)
        else:
            shutil.rmtree(args.work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
