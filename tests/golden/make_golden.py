#!/usr/bin/env python3
"""Generate the tier-2 golden-parity fixtures for attnserve from Hugging Face.

What it produces (both checked in, read by tests/golden/golden_parity_test.cc):

  tests/golden/minilm_cases.json
      {"model", "model_sha256", "versions": {torch, transformers,
       sentence_transformers, ...}, "cases": [ {name, text, text_pair,
       max_length, truncation_side, input_ids, token_type_ids, tokens, offsets,
       seq_len, rows, pooled_source}, ... ]}
      `offsets` are the tokenizer's return_offsets_mapping: [start, end) in
      Unicode code points of the original string (of `text`, or of `text_pair`
      for the pair's second segment); special tokens are [0, 0].
      `rows` are the token positions whose hidden states / attention rows are
      stored: every row when seq_len <= 64, else first 4, 4 from the middle
      (seq_len//2 - 2 ...), last 4.

  tests/golden/minilm_golden.safetensors   (float32, little-endian)
      <name>.hidden_states  [num_layers+1, R, 384]  HF output_hidden_states at
                            `rows` (index 0 = embedding output after LayerNorm)
      <name>.attentions     [num_layers, 12, R, seq_len]  HF output_attentions
                            (post-softmax probabilities) at `rows`, all columns
      <name>.pooled         [384]  L2-normalised sentence embedding; see
                            `pooled_source`:
                            "sentence_transformers": SentenceTransformer(model
                              dir).encode(text) (Transformer -> mean Pooling ->
                              Normalize), used for single texts that fit in the
                              model's max_seq_length (256) without truncation;
                            "mean_pool_manual": mean of HF last_hidden_state
                              over all tokens (attention mask all ones), then
                              L2-normalised; used for pairs and truncated input.

Every case is run alone (batch 1, no padding, attention mask all ones), float32,
model.eval(), torch.no_grad(), eager attention.

How to run (never run by CI; needs the venv from setup_venv.sh):

  bash tests/golden/setup_venv.sh
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      .venv-golden/bin/python tests/golden/make_golden.py \
      [--model-dir models/all-MiniLM-L6-v2] [--out-dir tests/golden]

Run from the repository root (paths default relative to this file).
"""

import argparse
import os
import sys

# Never touch the network: the model is a local folder.
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

DEFAULT_MAX_LENGTH = 512
ALL_ROWS_LIMIT = 64  # store every row up to this many tokens
EDGE_ROWS = 4        # else first/middle/last this many rows (keeps the file small)
ST_COSINE_MIN = 0.999999
# Exactly 100 characters, WordPiece-splittable into 15 pieces.
LONG_WORD_100 = "understanding" * 7 + "nationali"


def long_english_text():
    """Deterministic prose that tokenizes to well over 512 tokens."""
    base = (
        "Paragraph {n}. The committee reviewed the quarterly report on river "
        "levels, noting that rainfall in the northern valleys had exceeded the "
        "long-term average by a modest margin. Engineers proposed reinforcing "
        "three embankments before winter, while the finance office asked for "
        "a revised estimate that included contingency costs. After a short "
        "debate, members agreed to publish the findings and invite comments "
        "from residents. "
    )
    return "".join(base.format(n=i) for i in range(1, 11))


def build_cases():
    """Each case: name, text, text_pair, max_length, truncation_side."""
    def c(name, text, text_pair=None, max_length=DEFAULT_MAX_LENGTH,
          truncation_side="right"):
        return dict(name=name, text=text, text_pair=text_pair,
                    max_length=max_length, truncation_side=truncation_side)

    long_text = long_english_text()
    left_text = ("The first part of this sentence will be cut away, because "
                 "left truncation keeps only the final tokens of the input, "
                 "which end right here at the very end.")
    return [
        # The CLI acceptance test compares against this pooled embedding.
        c("king_queen", "The king spoke to the queen."),
        c("long_english",
          "Although the afternoon train was delayed by nearly forty minutes, "
          "the passengers remained remarkably patient, reading newspapers and "
          "chatting quietly until the conductor finally announced departure."),
        c("accents", "Le café est naïve, mais délicieux."),
        c("cjk_chinese", "我爱北京天安门"),
        c("cjk_japanese", "東京は日本の首都で、とても大きな都市です。"),
        c("korean_hangul", "안녕하세요, 세계!"),
        c("cyrillic_greek", "Привет, мир! Йошкар. Γειά σου."),
        c("emoji", "I love pizza 🍕🔥 so much 👍🏽"),
        # 200 chars > WordPiece max_input_chars_per_word (100) -> [UNK].
        c("long_word_200", "a" * 200),
        # Boundary of max_input_chars_per_word: 100 chars splits into
        # word pieces, 101 chars becomes a single [UNK].
        c("long_word_100", LONG_WORD_100),
        c("long_word_101", LONG_WORD_100 + "s"),
        c("punctuation_runs", "Wait... what?!?! -- no way!!!"),
        c("mixed_case", "HeLLo WoRLD, iPhone and McDonald's"),
        c("numbers", "Pay $1,234.56 (42%) at 12:30pm; 3.14159."),
        c("whitespace_controls",
          "line one\nline two\tcolumn\r\nend  with   gaps\u00a0nbsp "
          "zero\u200bwidth soft\u00adhyphen"),
        c("text_pair", "How old are you?",
          text_pair="I am six years old, and my sister is nine."),
        c("truncated_512", long_text, max_length=512, truncation_side="right"),
        c("left_truncated_32", left_text, max_length=32,
          truncation_side="left"),
        c("only_spaces", "     "),
    ]


def mean_pool_normalised(last_hidden):
    """[1, S, H] -> [H]: mean over all tokens (mask all ones), L2-normalised."""
    mask = torch.ones(last_hidden.shape[:2], dtype=last_hidden.dtype)
    summed = (last_hidden * mask.unsqueeze(-1)).sum(dim=1)
    pooled = summed / torch.clamp(mask.sum(dim=1, keepdim=True), min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)[0]


def load_model(model_dir):
    kwargs = dict(torch_dtype=torch.float32)
    try:
        model = AutoModel.from_pretrained(model_dir, attn_implementation="eager",
                                          **kwargs)
    except TypeError:
        model = AutoModel.from_pretrained(model_dir, **kwargs)
    model.eval()
    impl = getattr(model.config, "_attn_implementation", "eager")
    assert impl == "eager", impl
    return model


def tokenize(tok, case):
    tok.truncation_side = case["truncation_side"]
    enc = tok(case["text"], case["text_pair"], add_special_tokens=True,
              truncation=True, max_length=case["max_length"], padding=False,
              return_offsets_mapping=True, return_token_type_ids=True,
              return_attention_mask=True)
    tok.truncation_side = "right"
    return enc


def untruncated_len(tok, case):
    enc = tok(case["text"], case["text_pair"], add_special_tokens=True,
              truncation=False, padding=False)
    return len(enc["input_ids"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir",
                    default=os.path.join(REPO, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--out-dir", default=HERE)
    args = ap.parse_args()
    model_dir = os.path.abspath(args.model_dir)

    torch.set_grad_enabled(False)
    torch.manual_seed(0)

    tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    assert tok.is_fast, type(tok)
    assert type(tok).__name__ == "BertTokenizerFast", type(tok).__name__
    model = load_model(model_dir)
    cfg = model.config
    num_layers, hidden, heads = (cfg.num_hidden_layers, cfg.hidden_size,
                                 cfg.num_attention_heads)

    st = SentenceTransformer(model_dir, device="cpu")
    st.eval()
    st_max = st.max_seq_length
    assert st_max == 256, st_max
    st_modules = [type(m).__name__ for m in st]
    assert st_modules == ["Transformer", "Pooling", "Normalize"], st_modules

    cases_json = []
    tensors = {}
    for case in build_cases():
        name = case["name"]
        enc = tokenize(tok, case)
        ids = enc["input_ids"]
        seq_len = len(ids)
        assert seq_len <= case["max_length"]
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        assert tok.pad_token_id not in ids
        full_len = untruncated_len(tok, case)
        truncated = full_len > seq_len

        input_ids = torch.tensor([ids], dtype=torch.long)
        type_ids = torch.tensor([enc["token_type_ids"]], dtype=torch.long)
        attn_mask = torch.ones_like(input_ids)
        with torch.no_grad():
            out = model(input_ids=input_ids, token_type_ids=type_ids,
                        attention_mask=attn_mask, output_hidden_states=True,
                        output_attentions=True, return_dict=True)
        hs = torch.stack(out.hidden_states, dim=0)[:, 0]   # [L+1, S, H]
        at = torch.stack(out.attentions, dim=0)[:, 0]      # [L, heads, S, S]
        assert hs.shape == (num_layers + 1, seq_len, hidden), hs.shape
        assert at.shape == (num_layers, heads, seq_len, seq_len), at.shape
        assert hs.dtype == torch.float32 and at.dtype == torch.float32
        assert torch.allclose(out.last_hidden_state[0], hs[-1])
        row_sums = at.sum(dim=-1)
        assert torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-5)

        rows = pick_rows(seq_len, ALL_ROWS_LIMIT, EDGE_ROWS)
        idx = torch.tensor(rows, dtype=torch.long)
        manual = mean_pool_normalised(out.last_hidden_state)

        use_st = case["text_pair"] is None and not truncated and seq_len <= st_max
        if use_st:
            # ST must see the same token ids as HF for this to be comparable.
            st_ids = st.tokenize([case["text"]])["input_ids"][0].tolist()
            assert st_ids == ids, (name, st_ids, ids)
            emb = st.encode(case["text"], convert_to_numpy=True,
                            normalize_embeddings=False)
            emb = np.asarray(emb, dtype=np.float32)
            assert emb.shape == (hidden,), emb.shape
            assert abs(float(np.linalg.norm(emb)) - 1.0) < 1e-5
            m = manual.numpy().astype(np.float64)
            cos = float(np.dot(m, emb) / (np.linalg.norm(m) * np.linalg.norm(emb)))
            assert cos > ST_COSINE_MIN, (name, cos)
            pooled, pooled_source = emb, "sentence_transformers"
        else:
            pooled = manual.numpy().astype(np.float32)
            pooled_source = "mean_pool_manual"

        tensors[f"{name}.hidden_states"] = np.ascontiguousarray(
            hs.index_select(1, idx).numpy(), dtype=np.float32)
        tensors[f"{name}.attentions"] = np.ascontiguousarray(
            at.index_select(2, idx).numpy(), dtype=np.float32)
        tensors[f"{name}.pooled"] = np.ascontiguousarray(pooled,
                                                         dtype=np.float32)

        cases_json.append({
            "name": name,
            "text": case["text"],
            "text_pair": case["text_pair"],
            "max_length": case["max_length"],
            "truncation_side": case["truncation_side"],
            "input_ids": list(ids),
            "token_type_ids": list(enc["token_type_ids"]),
            "tokens": tok.convert_ids_to_tokens(ids),
            "offsets": [[int(s), int(e)] for s, e in enc["offset_mapping"]],
            "seq_len": seq_len,
            "untruncated_len": full_len,
            "rows": rows,
            "pooled_source": pooled_source,
        })
        print(f"{name:22s} seq_len={seq_len:4d} (untruncated {full_len:4d}) "
              f"rows={len(rows):3d} pooled={pooled_source}", file=sys.stderr)

    names = [c["name"] for c in cases_json]
    assert len(names) == len(set(names)) and len(names) >= 12
    _check_expected_shapes(cases_json, tok)

    versions = library_versions()

    doc = {
        "model": os.path.basename(model_dir.rstrip("/")),
        "model_sha256": sha256_file(os.path.join(model_dir, "model.safetensors")),
        "versions": versions,
        "num_layers": num_layers,
        "num_heads": heads,
        "hidden_size": hidden,
        "sentence_transformers_max_seq_length": st_max,
        "cases": cases_json,
    }
    write_fixture(
        os.path.join(args.out_dir, "minilm_cases.json"),
        os.path.join(args.out_dir, "minilm_golden.safetensors"), doc, tensors,
        "tests/golden/make_golden.py (%s; cases in minilm_cases.json)"
        % doc["model"])


def _check_expected_shapes(cases_json, tok):
    """Assertions about the edge cases the fixture set is meant to cover."""
    by = {c["name"]: c for c in cases_json}
    assert by["truncated_512"]["seq_len"] == 512
    assert by["truncated_512"]["untruncated_len"] > 512
    lt = by["left_truncated_32"]
    assert lt["seq_len"] == 32 and lt["untruncated_len"] > 32
    # Left truncation keeps [CLS] and the tail of the text.
    assert lt["tokens"][0] == "[CLS]" and lt["tokens"][-1] == "[SEP]"
    assert lt["offsets"][-2][1] == len(lt["text"])
    assert by["only_spaces"]["tokens"] == ["[CLS]", "[SEP]"]
    assert by["long_word_200"]["tokens"] == ["[CLS]", "[UNK]", "[SEP]"]
    assert by["long_word_101"]["tokens"] == ["[CLS]", "[UNK]", "[SEP]"]
    assert len(LONG_WORD_100) == 100
    assert "[UNK]" not in by["long_word_100"]["tokens"]
    tp = by["text_pair"]
    assert 0 in tp["token_type_ids"] and 1 in tp["token_type_ids"]
    assert tp["tokens"].count("[SEP]") == 2
    assert all(t == 0 for c in cases_json if c["text_pair"] is None
               for t in c["token_type_ids"])


if __name__ == "__main__":
    main()
