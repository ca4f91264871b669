#!/usr/bin/env python3
"""Reference BM42 sparse vectors for engine/explain/sparse_bm42.h, computed from Hugging Face
attentions by fastembed's recipe with fastembed's own hashing and stemming libraries (mmh3,
py_rust_stemmers); nothing from attnserve.

Writes tests/golden/bm42_cases.json. Run from the golden venv (tests/golden/setup_venv.sh; it
installs mmh3 and py-rust-stemmers from requirements.txt):
    .venv-golden/bin/python tests/golden/make_bm42_golden.py [--model-dir DIR]

Recipe (fastembed.sparse.bm42.Bm42, document path):
  attention = BertModel(eager, eval) output_attentions[-1][0]     (heads, T, T), one text, unpadded
  w         = attention[:, 0, :].mean(over heads)                 [CLS] row, float32
  words     = word pieces merged ("##" appends; special tokens skipped, not ending a word),
              a word's weight = sum of its pieces' w
  filter    = drop stop words (NLTK English, below) and single string.punctuation characters
  stem      = py_rust_stemmers.SnowballStemmer("english").stem_word
  combine   = max weight per stem
  index     = abs(mmh3.hash(stem))             value = log(1 + weight) ** 0.5
Also the attention-weighted pooling: sum_t w[t] * last_hidden_state[t].
"""
import argparse
import json
import math
import os
import string
import sys

import mmh3
import torch
from py_rust_stemmers import SnowballStemmer
from transformers import BertModel, BertTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from golden_common import library_versions, sha256_file  # noqa: E402

STOPWORDS = set("""i me my myself we our ours ourselves you you're you've you'll you'd your yours
yourself yourselves he him his himself she she's her hers herself it it's its itself they them
their theirs themselves what which who whom this that that'll these those am is are was were be
been being have has had having do does did doing a an the and but if or because as until while
of at by for with about against between into through during before after above below to from up
down in out on off over under again further then once here there when where why how all any both
each few more most other some such no nor not only own same so than too very s t can will just
don don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't
doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't
needn needn't shan shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn
wouldn't""".split())
assert len(STOPWORDS) == 179
PUNCTUATION = set(string.punctuation)

SENTENCES = [
    "I must not fear. Fear is the mind-killer.",
    "All animals are equal, but some animals are more equal than others.",
    "It was a pleasure to burn.",
    "The sky above the port was the color of television, tuned to a dead channel.",
    "In the beginning, the universe was created. This has made a lot of people very angry.",
    "It's a truth universally acknowledged that a zombie must be in want of more brains.",
    "War is peace. Freedom is slavery. Ignorance is strength.",
    "We're not in Infinity; we're in the suburbs.",
    "I was a thousand times more evil than thou!",
    "History is merely a list of surprises... It can only prepare us to be surprised yet again.",
    "hello world",
    "attention embedding",
    "Qdrant builds sparse vectors from transformer attention.",
    "Running runners ran quickly through the running track.",
    "The photosynthesis of chlorophyll-rich leaves accelerates in sunlight.",
    "Stainless steel kitchen knives, set of 6, dishwasher safe.",
    "Wireless noise-cancelling headphones with 30-hour battery life.",
    "Organic cotton t-shirt for men, slim fit, navy blue.",
    "USB-C charging cable (2 m), braided nylon, fast charge 60W.",
    "Ergonomic office chair with lumbar support and adjustable armrests.",
    "How do I reset my password if I no longer have access to my email?",
    "What is the capital of Australia?",
    "Canberra is the capital city of Australia, not Sydney.",
    "The quick brown fox jumps over the lazy dog.",
    "Déjà vu: the café served crème brûlée again.",
    "Tokyo's subway system carries millions of passengers every day.",
    "Antidisestablishmentarianism is a famously long English word.",
    "Machine learning models require large amounts of labelled data.",
    "She sells sea shells by the sea shore.",
    "The mitochondria is the powerhouse of the cell.",
    "Buffalo buffalo Buffalo buffalo buffalo buffalo Buffalo buffalo.",
    "Prices rose 3.5% in March, the highest increase since 2008.",
    "Can't stop, won't stop: they didn't listen and wouldn't care.",
    "Email support@example.com or call +1-555-0100 for help.",
    "The axolotl is a paedomorphic salamander native to Mexico.",
    "Quantum entanglement links particles across large distances.",
    "Bake the bread at 220 degrees for thirty minutes.",
    "Football fans celebrated the championship victory downtown.",
    "The committee postponed the vote until further notice.",
    "Solar panels convert sunlight directly into electricity.",
    "Vintage leather boots, hand-stitched, size 42.",
    "A stitch in time saves nine.",
    "The children played happily in the garden while their parents cooked.",
    "Cryptocurrency markets are notoriously volatile.",
    "Ancient Romans built aqueducts to transport water into cities.",
    "Please review the attached invoice and confirm payment by Friday.",
    "Jupiter's Great Red Spot is a storm larger than Earth.",
    "Interoperability between systems requires standardized protocols.",
    "He was running, she was swimming, and they were both exhausted.",
    "Unbelievably, the unbreakable glass broke.",
    "Retrieval-augmented generation combines search with language models.",
    "The violinist's performance moved the audience to tears.",
    "Rainforests host more than half of the world's plant species.",
    "Tiny houses are becoming popular among young professionals.",
    "Ice cream melts quickly on hot summer days.",
    "Database indexes speed up queries but slow down writes.",
    "!!! ??? ...",
    ".",
]

POOL_SENTENCES = SENTENCES[:6]


def reconstruct(tokens, special):
    out, acc, idx = [], "", []
    for i, tok in enumerate(tokens):
        if tok in special:
            continue
        if tok.startswith("##"):
            acc += tok[2:]
            idx.append(i)
        else:
            if acc:
                out.append((acc, idx))
                idx = []
            acc = tok
            idx.append(i)
    if acc:
        out.append((acc, idx))
    return out


def bm42(tok, stemmer, tokens, w):
    special = set(tok.all_special_tokens)
    words = reconstruct(tokens, special)
    words = [(t, i) for t, i in words if t not in STOPWORDS and t not in PUNCTUATION]
    stemmed = [(stemmer.stem_word(t), i) for t, i in words]
    weighted = [(t, sum(w[i] for i in idx)) for t, idx in stemmed]
    best = {}
    for t, v in weighted:
        best[t] = max(best.get(t, 0), v)
    vec = {}
    for t, v in best.items():
        vec[abs(mmh3.hash(t))] = math.log(1.0 + v) ** 0.5
    return vec, list(best)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=os.path.join(REPO, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--out", default=os.path.join(HERE, "bm42_cases.json"))
    args = ap.parse_args()
    tok = BertTokenizerFast.from_pretrained(args.model_dir)
    model = BertModel.from_pretrained(args.model_dir, attn_implementation="eager",
                                      torch_dtype=torch.float32)
    model.eval()
    stemmer = SnowballStemmer("english")
    cases = []
    for text in SENTENCES:
        enc = tok(text, truncation=True, max_length=512)
        ids = enc["input_ids"]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True,
                        output_hidden_states=True, return_dict=True)
        att = out.attentions[-1][0]                      # (heads, T, T)
        w = att[:, 0, :].mean(dim=0).numpy()             # float32, as fastembed's np.mean
        tokens = tok.convert_ids_to_tokens(ids)
        vec, stems = bm42(tok, stemmer, tokens, [float(x) for x in w])
        indices = sorted(vec)
        case = {"text": text, "ids": ids, "stems": stems, "indices": indices,
                "values": [vec[i] for i in indices], "cls_attention": w.tolist()}
        if text in POOL_SENTENCES:
            h = out.last_hidden_state[0]
            case["attention_pooled"] = (att[:, 0, :].mean(dim=0)[:, None] * h).sum(0).tolist()
        cases.append(case)
    hashes = {s: mmh3.hash(s) for s in ["", "a", "ab", "abc", "abcd", "foo", "hello world",
                                         "caf\u00e9", "axolotl"]}
    doc = {"generator": "tests/golden/make_bm42_golden.py",
           "model_sha256": sha256_file(os.path.join(args.model_dir, "model.safetensors")),
           "versions": dict(library_versions(), mmh3=mmh3.__version__ if hasattr(
               mmh3, "__version__") else "?"),
           "mmh3_hash": hashes, "cases": cases}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} sentences", file=sys.stderr)


if __name__ == "__main__":
    main()
