#!/usr/bin/env python3
"""Writes the fuzzers' checked-in inputs: a tiny BERT model and the seed corpora.

    fuzz/make_seeds.py            # rewrites fuzz/tiny_model/ and fuzz/corpus/*/seed-* files

Standard library only, plus `protoc` (Debian's protobuf-compiler, already a build dependency)
to serialize the request seeds from text format. Deterministic: running it twice gives the same
bytes, so the checked-in files can be compared with a fresh run. Files in fuzz/corpus/ not named
seed-* (crash reproducers kept as regression inputs) are left alone.

fuzz/tiny_model/ is a complete Hugging Face model directory (config.json, model.safetensors,
vocab.txt, tokenizer_config.json, 1_Pooling/config.json, modules.json) with hidden size 8,
2 layers, 2 heads, 16 positions and a 113-token vocabulary: small enough that the request fuzzer
runs a real forward pass per input, and a valid safetensors seed. Its weights are random (seeded)
and mean nothing.
"""

import json
import os
import random
import shutil
import struct
import subprocess
import sys

FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(FUZZ_DIR)
TINY = os.path.join(FUZZ_DIR, "tiny_model")
CORPUS = os.path.join(FUZZ_DIR, "corpus")
REAL_MODEL = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")

HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS, TYPES = 8, 2, 2, 16, 16, 2

TINY_CONFIG = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": POSITIONS,
    "model_type": "bert",
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": TYPES,
    "vocab_size": 113,  # len(tiny_vocab())
}


def tiny_vocab():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += list("abcdefghijklmnopqrstuvwxyz0123456789")
    vocab += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab += list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    vocab += ["the", "king", "queen", "spoke", "to", "##s", "##ing", "##ed", "un", "##able"]
    vocab += ["中", "国", "日", "本"]
    return vocab


# --- safetensors ---------------------------------------------------------------------------------

DTYPE_FORMAT = {"F32": "<f", "F64": "<d", "I64": "<q", "I32": "<i", "U8": "<B", "BOOL": "<B"}


def safetensors_bytes(tensors, metadata=None, pad_to=8):
    """tensors: list of (name, dtype, shape, raw bytes). Header padded with spaces like HF."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + data


def raw_header(text):
    """A file with this exact header text and no data."""
    return struct.pack("<Q", len(text)) + text


def pack(fmt, values):
    return b"".join(struct.pack(fmt, v) for v in values)


def bert_tensors(rng, vocab_size, prefix=""):
    """The Hugging Face BERT tensor names and shapes for the tiny config, random fp32 values."""
    shapes = [("embeddings.word_embeddings.weight", [vocab_size, HIDDEN]),
              ("embeddings.position_embeddings.weight", [POSITIONS, HIDDEN]),
              ("embeddings.token_type_embeddings.weight", [TYPES, HIDDEN]),
              ("embeddings.LayerNorm.weight", [HIDDEN]),
              ("embeddings.LayerNorm.bias", [HIDDEN])]
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}."
        for part in ("query", "key", "value"):
            shapes += [(p + f"attention.self.{part}.weight", [HIDDEN, HIDDEN]),
                       (p + f"attention.self.{part}.bias", [HIDDEN])]
        shapes += [(p + "attention.output.dense.weight", [HIDDEN, HIDDEN]),
                   (p + "attention.output.dense.bias", [HIDDEN]),
                   (p + "attention.output.LayerNorm.weight", [HIDDEN]),
                   (p + "attention.output.LayerNorm.bias", [HIDDEN]),
                   (p + "intermediate.dense.weight", [INTERMEDIATE, HIDDEN]),
                   (p + "intermediate.dense.bias", [INTERMEDIATE]),
                   (p + "output.dense.weight", [HIDDEN, INTERMEDIATE]),
                   (p + "output.dense.bias", [HIDDEN]),
                   (p + "output.LayerNorm.weight", [HIDDEN]),
                   (p + "output.LayerNorm.bias", [HIDDEN])]
    out = []
    for name, shape in shapes:
        count = 1
        for d in shape:
            count *= d
        if name.endswith("LayerNorm.weight"):
            values = [1.0 + rng.uniform(-0.1, 0.1) for _ in range(count)]
        else:
            values = [rng.gauss(0.0, 0.5) for _ in range(count)]
        out.append((prefix + name, "F32", shape, pack("<f", values)))
    return out


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def make_tiny_model(rng):
    shutil.rmtree(TINY, ignore_errors=True)
    vocab = tiny_vocab()
    assert len(vocab) == TINY_CONFIG["vocab_size"]
    write(os.path.join(TINY, "config.json"), json.dumps(TINY_CONFIG, indent=2) + "\n")
    write(os.path.join(TINY, "vocab.txt"), "\n".join(vocab) + "\n")
    write(os.path.join(TINY, "tokenizer_config.json"),
          json.dumps({"do_lower_case": True, "model_max_length": POSITIONS,
                      "tokenize_chinese_chars": True, "strip_accents": None}) + "\n")
    write(os.path.join(TINY, "modules.json"), json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}], indent=2) + "\n")
    write(os.path.join(TINY, "1_Pooling", "config.json"), json.dumps({
        "word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}, indent=2) + "\n")
    weights = safetensors_bytes(bert_tensors(rng, len(vocab)), metadata={"format": "pt"})
    write(os.path.join(TINY, "model.safetensors"), weights)
    return weights


# --- corpora -------------------------------------------------------------------------------------


def clear_seeds(target):
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.startswith("seed-"):
            os.remove(os.path.join(directory, name))
    return directory


def make_safetensors_corpus(rng, tiny_weights):
    d = clear_seeds("safetensors")
    write(os.path.join(d, "seed-tiny-model"), tiny_weights)
    f16 = struct.pack("<4e", 1.0, -2.5, 65504.0, 6e-8)
    bf16 = b"".join(struct.pack("<f", v)[2:] for v in (1.0, -3.0, 1e30, -0.0))
    seeds = {
        "seed-f16": safetensors_bytes([("x", "F16", [2, 2], f16)]),
        "seed-bf16": safetensors_bytes([("y", "BF16", [4], bf16)]),
        "seed-f64-scalar": safetensors_bytes([("s", "F64", [], pack("<d", [3.25]))]),
        "seed-mixed-metadata": safetensors_bytes(
            [("a.ids", "I64", [3], pack("<q", [1, -2, 3])),
             ("b.mask", "BOOL", [2, 1], b"\x01\x00"),
             ("c.empty", "F32", [0, 4], b""),
             ("d", "F32", [1, 2], pack("<f", [0.5, -0.5]))],
            metadata={"format": "pt", "origin": "make_seeds.py"}),
        "seed-bert-prefix": safetensors_bytes(
            [(n, t, s, r) for n, t, s, r in bert_tensors(rng, len(tiny_vocab()), "bert.")[:5]]),
        "seed-empty-header": safetensors_bytes([]),
        # Deeper than engine/json_depth.h allows: rejected before parsing (see the README's
        # fuzzing findings; the crash itself needed ~100,000 levels, more than -max_len holds).
        "seed-deep-nesting": raw_header(
            b'{"d":{"dtype":"F32","shape":[' + b"[" * 100 + b"]" * 100 +
            b'],"data_offsets":[0,0]}}'),
    }
    for name, data in seeds.items():
        write(os.path.join(d, name), data)


def make_config_corpus():
    d = clear_seeds("model_config")
    write(os.path.join(d, "seed-tiny-config"), json.dumps(TINY_CONFIG))
    with open(os.path.join(TINY, "1_Pooling", "config.json"), "rb") as f:
        write(os.path.join(d, "seed-pooling-mean"), f.read())
    if os.path.isfile(os.path.join(REAL_MODEL, "config.json")):
        with open(os.path.join(REAL_MODEL, "config.json"), "rb") as f:
            write(os.path.join(d, "seed-minilm-config"), f.read())
    write(os.path.join(d, "seed-pooling-cls"), json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
         "pooling_mode_max_tokens": False}))
    relative = dict(TINY_CONFIG, position_embedding_type="relative_key", hidden_act="gelu_new",
                    layer_norm_eps=1e-5, is_decoder=False, num_attention_heads=3)
    write(os.path.join(d, "seed-rejected-config"), json.dumps(relative))
    write(os.path.join(d, "seed-deep-nesting"), '{"vocab_size":' + "[" * 100 + "]" * 100 + "}")


# Tokenizer fuzz input: [flags][max_length] text_a [0xFF text_b]. 0xFF never occurs in UTF-8, so
# any valid pair of texts can be written; flags: bit 0 pair, bit 1 truncation on, bit 2 left side,
# bit 3 token-id mode (the rest of the input is little-endian int32 ids, then type ids).
TOKENIZER_TEXTS = [
    "The king spoke to the queen.",
    "Héllo, Wörld! Café naïve coöperate ÅNGSTRÖM",
    "我爱北京天安门。日本語のテキスト",
    "tabs\tand\nnewlines\r\n and  spaces \u00a0nbsp \u3000ideographic",
    "control \x00\x01\x1f chars \u200b zero-width \ufeff bom",
    "[CLS] special [SEP] tokens [MASK] in [PAD] text [UNK]",
    "emoji 👋🏽 👨‍👩‍👧 flags 🇫🇷 and combining e\u0301 a\u0308",
    "supercalifragilisticexpialidocious" * 4,
    "punctuation!!!...???---(((brackets)))'''\"\"\"$$$",
    "العربية עברית Ελληνικά Русский ไทย हिन्दी",
    "12345 3.14159 1,000,000 0x1F 1e-9",
    "",
]


def make_tokenizer_corpus():
    d = clear_seeds("tokenizer")
    for i, text in enumerate(TOKENIZER_TEXTS):
        write(os.path.join(d, f"seed-single-{i:02d}"), bytes([0x02, 32]) + text.encode())
    pairs = [(0, 1), (2, 3), (5, 6), (7, 11), (9, 8)]
    for i, (a, b) in enumerate(pairs):
        flags = 0x01 | 0x02 | (0x04 if i % 2 else 0)
        write(os.path.join(d, f"seed-pair-{i:02d}"),
              bytes([flags, 8 + 3 * i]) + TOKENIZER_TEXTS[a].encode() + b"\xff" +
              TOKENIZER_TEXTS[b].encode())
    ids = [101, 1996, 2332, 3764, 2000, 1996, 3035, 1012, 102]
    write(os.path.join(d, "seed-ids"), bytes([0x08, 0]) + pack("<i", ids) + pack("<i", [0] * 9))


# Request fuzz input: [split << 2 | kind] then a serialized message; kind 0 = EncodeRequest,
# 1 = AttentionMapRequest, 2 = ExplainRequest; split = where the bytes are cut into two gRPC
# slices. Written in text format and serialized by protoc.
ENCODE_REQUESTS = [
    'inputs { text: "The king spoke to the queen." }',
    'inputs { text: "a" } inputs { pair { first: "the king" second: "queen" } } '
    'pooling: POOLING_CLS normalize: true return_token_embeddings: true '
    'hidden_layers: [0, -1, 2] return_static_embeddings: true output_dtype: FLOAT16',
    'inputs { tokens { ids: [2, 60, 61, 3] type_ids: [0, 0, 1, 1] } } pooling: POOLING_MAX '
    'output_dtype: BFLOAT16',
    'inputs { text: "spoke spoke spoke spoke spoke spoke spoke spoke spoke spoke spoke spoke" } '
    'tokenization { truncation: TRUNCATION_LEFT max_length: 6 } pooling: POOLING_NONE '
    'return_token_embeddings: true',
    'inputs { text: "too long for sixteen positions, with truncation off entirely ok" } '
    'tokenization { truncation: TRUNCATION_NONE }',
    'inputs { tokens { ids: [2, 999999, 3] } } hidden_layers: 7 model_version: "base"',
]
ATTENTION_REQUESTS = [
    'inputs { text: "The king spoke to the queen." } layers: [0, 1] heads: [1]',
    'inputs { pair { first: "中国" second: "日本" } } layers: -1 include_scores: true '
    'include_qkv: true mean_over_heads: true rollout: true top_k: 3 output_dtype: FLOAT16',
    'inputs { text: "un able" } inputs { text: "kings" } include_weights: false rollout: true',
    'inputs { tokens { ids: [2, 5, 3] } } layers: [1, 1] heads: [0, 0] top_k: -1',
]

EXPLAIN_REQUESTS = [
    'query: "the king spoke" documents: "the queen spoke" steps: 4',
    'query: "kings" documents: ["un able", "中国"] method: ATTRIBUTION_INTEGRATED_GRADIENTS '
    'steps: 3 layer: 1 baseline: BASELINE_MASK_TOKENS word_level: true',
    'query: "a b c" documents: "a" method: ATTRIBUTION_GRADIENT_X_INPUT baseline: '
    'BASELINE_ZERO',
    'query: "the king spoke to the queen and the king spoke to the queen again" '
    'documents: "" steps: 0',
]


def protoc_encode(message, text):
    proto_dir = os.path.join(ROOT, "proto")
    return subprocess.run(
        ["protoc", f"--encode=attnserve.v1.{message}", f"-I{proto_dir}",
         os.path.join(proto_dir, "attnserve", "v1", "encoder.proto")],
        input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


def make_request_corpus():
    d = clear_seeds("request")
    for i, text in enumerate(ENCODE_REQUESTS):
        write(os.path.join(d, f"seed-encode-{i:02d}"),
              bytes([(7 * i) << 2]) + protoc_encode("EncodeRequest", text))
    for i, text in enumerate(ATTENTION_REQUESTS):
        write(os.path.join(d, f"seed-attention-{i:02d}"),
              bytes([(5 * i) << 2 | 1]) + protoc_encode("AttentionMapRequest", text))
    for i, text in enumerate(EXPLAIN_REQUESTS):
        write(os.path.join(d, f"seed-explain-{i:02d}"),
              bytes([(3 * i) << 2 | 2]) + protoc_encode("ExplainRequest", text))


def main():
    rng = random.Random(20240607)
    weights = make_tiny_model(rng)
    make_safetensors_corpus(rng, weights)
    make_config_corpus()
    make_tokenizer_corpus()
    make_request_corpus()
    total = sum(os.path.getsize(os.path.join(dp, f))
                for top in (TINY, CORPUS) for dp, _, fs in os.walk(top) for f in fs)
    print(f"make_seeds.py: wrote {TINY} and {CORPUS} ({total} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
