#!/usr/bin/env python3
"""Generate the MPNet (all-mpnet-base-v2) golden-parity fixtures from Hugging Face.

What it produces (both checked in, read by tests/golden/mpnet_parity_test.cc):

  tests/golden/mpnet_cases.json
      {"model", "model_sha256", "versions", "hidden_layers", "attention_layers",
       "relative_buckets": {"min_relative", "buckets"},
       "cases": [ {name, text, text_pair, max_length, truncation_side, input_ids,
                   token_type_ids, tokens, offsets, seq_len, untruncated_len, rows,
                   forward, pooled_source}, ... ]}
      `offsets`: return_offsets_mapping, [start, end) in code points of `text` (of
      `text_pair` for the second text); special tokens [0, 0].
      `relative_buckets.buckets[i]`: MPNetEncoder.relative_position_bucket of the relative
      position (key - query) = min_relative + i, for every distance a 512-token input has.
      Cases with "forward": false are tokenizer-only (no tensors).

  tests/golden/mpnet_golden.safetensors   (float32)
      <name>.hidden_states [len(hidden_layers), R, 768]  HF output_hidden_states at `rows`
                           (0 = embedding output after LayerNorm)
      <name>.attentions    [len(attention_layers), 12, R, seq_len]  post-softmax probabilities
      <name>.scores        [len(attention_layers), 12, R, seq_len]  pre-softmax scores
                           Q K^T / sqrt(d) + relative position bias, computed from the layer's
                           own q/k and the position_bias HF passes it (a forward hook), checked
                           to softmax to the probabilities HF returns
      <name>.pooled        [768]  L2-normalised sentence embedding: SentenceTransformer.encode
                           for single texts within its max_seq_length (384), else the mean of
                           HF last_hidden_state normalised ("mean_pool_manual")

Each case runs alone (batch 1, no padding, mask all ones), float32, eval, eager attention.

How to run (never run by CI; the venv of tests/golden/setup_venv.sh, which has transformers
4.40.2, torch 1.13 and sentence-transformers 2.7.0):

  scripts/setup.sh --no-build --model all-mpnet-base-v2
  .venv-golden/bin/python tests/golden/make_mpnet_golden.py \
      [--model-dir models/all-mpnet-base-v2] [--out-dir tests/golden]
"""

import argparse
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from golden_common import (library_versions, pick_rows, sha256_file,  # noqa: E402
                           write_fixture)
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

HIDDEN_LAYERS = [0, 1, 6, 12]  # keeps the file small: embedding output, first, middle, last
ATTENTION_LAYERS = [0, 11]
ALL_ROWS_LIMIT = 8
EDGE_ROWS = 2


def long_english_text():
    base = ("Paragraph {n}. The committee reviewed the quarterly report on river levels, noting "
            "that rainfall in the northern valleys had exceeded the long-term average by a "
            "modest margin. Engineers proposed reinforcing three embankments before winter. ")
    return "".join(base.format(n=i) for i in range(1, 25))


def build_cases():
    def c(name, text, text_pair=None, max_length=512, truncation_side="right", forward=True):
        return dict(name=name, text=text, text_pair=text_pair, max_length=max_length,
                    truncation_side=truncation_side, forward=forward)

    return [
        c("king_queen", "The king spoke to the queen."),
        c("accents", "Le café est naïve, mais délicieux. Ångström Øresund."),
        c("cjk", "我爱北京天安门。東京は日本の首都です。안녕하세요!"),
        c("emoji", "I love pizza 🍕🔥 so much 👍🏽"),
        c("text_pair", "How old are you?", text_pair="I am six years old, and my sister is nine."),
        c("truncated_512", long_english_text(), max_length=512),
        # Tokenizer only.
        c("mixed_case_numbers", "HeLLo WoRLD, iPhone: $1,234.56 (42%) at 12:30pm!", forward=False),
        c("whitespace_controls", "line one\nline two\tcolumn\r\nend  with   gaps\u00a0nbsp "
          "zero\u200bwidth soft\u00adhyphen", forward=False),
        c("long_word_101", "understanding" * 7 + "nationalis", forward=False),
        c("special_tokens_in_text", "Fill the <mask> here, then </s> and <s> stay.",
          forward=False),
        c("pair_truncated", "The first text is a little longer than the second one is.",
          text_pair="A short second text, cut too.", max_length=16, forward=False),
        c("left_truncated", "This sentence loses its beginning because truncation is on the "
          "left side, keeping the end.", max_length=12, truncation_side="left", forward=False),
        c("only_spaces", "     ", forward=False),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=os.path.join(REPO, "models", "all-mpnet-base-v2"))
    ap.add_argument("--out-dir", default=HERE)
    args = ap.parse_args()
    model_dir = os.path.abspath(args.model_dir)
    torch.set_grad_enabled(False)

    tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    assert type(tok).__name__ == "MPNetTokenizerFast", type(tok).__name__
    model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32,
                                      attn_implementation="eager")
    model.eval()
    cfg = model.config
    assert cfg.model_type == "mpnet"
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    head_dim = hidden // heads
    st = SentenceTransformer(model_dir, device="cpu")
    st.eval()

    # Pre-softmax scores: recomputed from each self-attention module's own inputs.
    captured = {}

    def hook(layer):
        def fn(module, inputs, output):
            hidden_states, mask, _, position_bias = inputs[:4]
            q = module.q(hidden_states)
            k = module.k(hidden_states)

            def split(x):
                return x.view(x.size(0), x.size(1), heads, head_dim).permute(0, 2, 1, 3)

            scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(head_dim)
            scores = scores + position_bias
            probs = output[1]
            assert torch.allclose(torch.softmax(scores + mask, dim=-1), probs, atol=1e-6)
            captured[layer] = scores[0]
        return fn

    for i, layer in enumerate(model.encoder.layer):
        layer.attention.attn.register_forward_hook(hook(i))

    max_rel = 512
    rel = torch.arange(-max_rel, max_rel + 1, dtype=torch.long)
    buckets = model.encoder.relative_position_bucket(rel, num_buckets=32, max_distance=128)

    cases_json, tensors = [], {}
    for case in build_cases():
        name = case["name"]
        tok.truncation_side = case["truncation_side"]
        enc = tok(case["text"], case["text_pair"], truncation=True,
                  max_length=case["max_length"], return_offsets_mapping=True,
                  return_token_type_ids=True)
        tok.truncation_side = "right"
        full_len = len(tok(case["text"], case["text_pair"], truncation=False)["input_ids"])
        ids = enc["input_ids"]
        seq_len = len(ids)
        entry = {
            "name": name, "text": case["text"], "text_pair": case["text_pair"],
            "max_length": case["max_length"], "truncation_side": case["truncation_side"],
            "input_ids": list(ids), "token_type_ids": list(enc["token_type_ids"]),
            "tokens": tok.convert_ids_to_tokens(ids),
            "offsets": [[int(s), int(e)] for s, e in enc["offset_mapping"]],
            "seq_len": seq_len, "untruncated_len": full_len, "forward": case["forward"],
        }
        if case["forward"]:
            input_ids = torch.tensor([ids], dtype=torch.long)
            captured.clear()
            out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                        output_hidden_states=True, output_attentions=True, return_dict=True)
            rows = pick_rows(seq_len, ALL_ROWS_LIMIT, EDGE_ROWS)
            idx = torch.tensor(rows, dtype=torch.long)
            hs = torch.stack([out.hidden_states[i][0] for i in HIDDEN_LAYERS])
            at = torch.stack([out.attentions[i][0] for i in ATTENTION_LAYERS])
            sc = torch.stack([captured[i] for i in ATTENTION_LAYERS])
            last = out.last_hidden_state[0]
            manual = torch.nn.functional.normalize(last.mean(dim=0), dim=0).numpy()
            if case["text_pair"] is None and full_len <= st.max_seq_length:
                st_ids = st.tokenize([case["text"]])["input_ids"][0].tolist()
                assert st_ids == ids, (name, st_ids, ids)
                pooled = np.asarray(st.encode(case["text"]), dtype=np.float32)
                assert float(np.dot(pooled, manual)) > 0.999999, name
                source = "sentence_transformers"
            else:
                pooled, source = manual.astype(np.float32), "mean_pool_manual"
            tensors[f"{name}.hidden_states"] = np.ascontiguousarray(
                hs.index_select(1, idx).numpy(), dtype=np.float32)
            tensors[f"{name}.attentions"] = np.ascontiguousarray(
                at.index_select(2, idx).numpy(), dtype=np.float32)
            tensors[f"{name}.scores"] = np.ascontiguousarray(
                sc.index_select(2, idx).numpy(), dtype=np.float32)
            tensors[f"{name}.pooled"] = np.ascontiguousarray(pooled, dtype=np.float32)
            entry.update(rows=rows, pooled_source=source)
        cases_json.append(entry)
        print(f"{name:24s} seq_len={seq_len:4d} untruncated={full_len:4d} "
              f"forward={case['forward']}", file=sys.stderr)

    by = {c["name"]: c for c in cases_json}
    assert by["truncated_512"]["seq_len"] == 512 and by["truncated_512"]["untruncated_len"] > 512
    assert by["text_pair"]["tokens"].count("</s>") == 3  # <s> a </s></s> b </s>
    assert by["pair_truncated"]["seq_len"] == 16
    assert by["left_truncated"]["seq_len"] == 12

    doc = {
        "model": os.path.basename(model_dir.rstrip("/")),
        "model_sha256": sha256_file(os.path.join(model_dir, "model.safetensors")),
        "versions": library_versions(),
        "hidden_layers": HIDDEN_LAYERS,
        "attention_layers": ATTENTION_LAYERS,
        "sentence_transformers_max_seq_length": st.max_seq_length,
        "relative_buckets": {"min_relative": -max_rel, "buckets": buckets.tolist()},
        "cases": cases_json,
    }
    write_fixture(os.path.join(args.out_dir, "mpnet_cases.json"),
                  os.path.join(args.out_dir, "mpnet_golden.safetensors"), doc, tensors,
                  "tests/golden/make_mpnet_golden.py (all-mpnet-base-v2; cases in "
                  "mpnet_cases.json)")


if __name__ == "__main__":
    main()
