"""A real attnserve server for the client's tests.

ATTNSERVE_BINARY names the server (ctest sets it to the build's attnserve) and ATTN_MODEL_DIR the
default model (default: the checkout's models/all-MiniLM-L6-v2). The server serves two models:
that one as "minilm" (the default) and fuzz/tiny_model as "tiny" (hidden size 8, 2 layers: what
a call routed by model= answers is told apart by its shape, and its jobs train in milliseconds).
It runs on ephemeral loopback ports with an API key on the Encoder service, a trainer token and
a model store in a temp dir, and a small --max-inputs-per-request so the client's splitting of
long lists is exercised.
"""
import json
import os
import pathlib
import subprocess
import time

import pytest

import attnserve

API_KEY = "client-test-api-key"
TRAINER_TOKEN = "client-test-trainer-token"
MAX_INPUTS_PER_REQUEST = 8
DEFAULT_MODEL = "minilm"
SECOND_MODEL = "tiny"
SECOND_HIDDEN = 8  # fuzz/tiny_model
# Stretched by ATTN_TEST_TIME_SCALE on slow (sanitizer, loaded) machines, like the C++ tests.
TIME_SCALE = float(os.environ.get("ATTN_TEST_TIME_SCALE", "1"))
ROOT = pathlib.Path(__file__).resolve().parents[3]
TINY_DIR = ROOT / "fuzz" / "tiny_model"


class Server:
    def __init__(self, process, grpc_port, log_path, store):
        self.process = process
        self.address = f"127.0.0.1:{grpc_port}"
        self.log_path = log_path
        # The model store: one directory per model, each version in its own.
        self.store = store

    def log_tail(self):
        return pathlib.Path(self.log_path).read_text(errors="replace")[-4000:]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    binary = os.environ.get("ATTNSERVE_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"ATTNSERVE_BINARY={binary!r} is not an executable attnserve "
                    "(ctest sets it; run the test through ctest or set it)")
    model_dir = os.environ.get("ATTN_MODEL_DIR") or str(ROOT / "models" / "all-MiniLM-L6-v2")
    work = tmp_path_factory.mktemp("attnserve")
    (work / "api.key").write_text(API_KEY + "\n")
    (work / "trainer.token").write_text(TRAINER_TOKEN + "\n")
    ready = work / "ready.json"
    args = [binary, "--host=127.0.0.1", "--port=0", "--metrics-port=0", "--http-port=-1",
            f"--ready-file={ready}", f"--api-key-file={work / 'api.key'}",
            f"--trainer-token-file={work / 'trainer.token'}", f"--model-store={work / 'store'}",
            f"--max-inputs-per-request={MAX_INPUTS_PER_REQUEST}", "--log-level=warning",
            f"--model={DEFAULT_MODEL}={model_dir}",
            f"--model={SECOND_MODEL}={TINY_DIR}"]
    log_path = work / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120 * TIME_SCALE
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"attnserve did not get ready (exit {process.poll()}):\n"
                        f"{log_path.read_text(errors='replace')[-4000:]}")
        time.sleep(0.05)
    s = Server(process, json.loads(ready.read_text())["grpc_port"], log_path, work / "store")
    yield s
    process.terminate()
    try:
        code = process.wait(timeout=60 * TIME_SCALE)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("attnserve did not exit within 60 s of SIGTERM")
    assert code == 0, f"attnserve exited {code} on SIGTERM:\n{s.log_tail()}"


@pytest.fixture(scope="session")
def client(server):
    with attnserve.Client(server.address, token=API_KEY, trainer_token=TRAINER_TOKEN,
                          timeout=120 * TIME_SCALE) as c:
        yield c
