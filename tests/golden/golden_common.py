"""Helpers shared by the fixture generators in tests/golden/ (make_golden.py,
make_grad_golden.py): file hashes, the versions block every fixture records,
and writing a fixture pair (JSON + safetensors) with a read-back check."""
import hashlib
import json
import os
import platform
import subprocess
import sys

import numpy as np
import safetensors
import safetensors.numpy
import sentence_transformers
import tokenizers
import torch
import transformers


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def debian_torch_version():
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "python3-torch"],
            capture_output=True, text=True, check=False)
        return out.stdout.strip() or None
    except OSError:
        return None


def library_versions():
    """What produced a fixture: recorded in its JSON so a diff can be traced."""
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    deb = debian_torch_version()
    if deb:
        versions["torch_debian_package"] = "python3-torch " + deb
    return versions


def write_fixture(json_path, st_path, doc, tensors, generator_note):
    """Writes doc as JSON and tensors as safetensors, then reads the tensors
    back and checks they are bit-identical to what was meant to be written."""
    os.makedirs(os.path.dirname(json_path), exist_ok=True)
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    # One metadata key only: the writer serialises metadata from an unordered
    # map, so several keys would make the file differ byte-wise between runs.
    safetensors.numpy.save_file(tensors, st_path,
                                metadata={"generator": generator_note})
    back = safetensors.numpy.load_file(st_path)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    print(f"wrote {json_path} ({os.path.getsize(json_path)} bytes), {st_path} "
          f"({os.path.getsize(st_path)} bytes, {len(tensors)} tensors)",
          file=sys.stderr)


def pick_rows(seq_len, all_rows_limit, edge_rows):
    """The token positions a fixture stores: every row up to all_rows_limit tokens, else the
    first, middle and last edge_rows rows."""
    if seq_len <= all_rows_limit:
        return list(range(seq_len))
    mid = seq_len // 2 - edge_rows // 2
    rows = (list(range(edge_rows)) + list(range(mid, mid + edge_rows)) +
            list(range(seq_len - edge_rows, seq_len)))
    assert rows == sorted(set(rows)), rows
    return rows
