#!/usr/bin/env python3
"""Reference attributions for engine/explain/attribution.h, computed with torch autograd on the
Hugging Face model (no captum, nothing from attnserve).

Writes tests/golden/explain_cases.json. Run from the golden venv (tests/golden/setup_venv.sh):
    .venv-golden/bin/python tests/golden/make_explain_golden.py [--model-dir DIR]

Recipe, written out independently of the C++:
  * Tokenise with BertTokenizerFast (each text alone, or as a pair), no padding, no truncation.
  * x = hidden_states[layer] of BertModel (eager attention, eval: no dropout); baseline r:
      pad  : ids with every non-special token replaced by [PAD], same type ids, hidden_states[layer]
      mask : the same with [MASK]
      zero : zeros
  * Path: alpha_k = (m - k) / m for k = 0..m (k = m is the baseline), hidden = r + alpha (x - r),
    run through encoder layers [layer, L) as one batch (all rows the same length: no mask).
  * f = F.normalize(mean over tokens of the last hidden state)  (the model's pooling + Normalize)
  * s(a, b) = f(a) . f(b)
  * integrated gradients of text a (b held at f(b)), reverse mode:
        g = d/d hidden of sum_{k<m} f(path_k) . f(b)        ig[i] = sum_h (x - r)[i,h] g_mean[i,h]
    with g_mean the mean over the m path rows; gradient x input gxi[i] = sum_h x[i,h] g_{k=0}[i,h].
  * pairwise (integrated Jacobians, Moeller et al. 2023, their formula for dot-product scores):
        u[i] = (1/m) sum_{k<m} J_f(path_k)[:, i] (x - r)[i]      A = u_a u_b^T
    u comes from torch's forward-mode autograd (torch.autograd.forward_ad): per path point, a
    batch of T copies of the point, copy i carrying the tangent (x - r)[i] on token i. The
    method's reference code builds the same J in reverse mode, one backward per embedding
    dimension (384 here); the script does that too on a small case for every 8th dimension
    ("reverse_mode_check") and asserts both agree, so the forward-mode u is the paper's J.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from transformers import BertModel, BertTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from golden_common import library_versions, sha256_file  # noqa: E402

LONG_PARAGRAPH = (
    "The committee reviewed the annual report on regional water supplies, noting that "
    "reservoir levels had fallen during the dry summer while demand from farms and new "
    "housing estates kept rising. Engineers proposed repairing leaking pipes, building a "
    "small desalination plant near the coast, and paying households to install rainwater "
    "tanks. Critics argued the plant would be expensive and noisy.")
LONG_TOKENS = 256  # the long case is exactly this many tokens, [CLS] and [SEP] included


def long_text(tok):
    """The longest prefix (in words) of the repeated paragraph that tokenises to LONG_TOKENS."""
    words = " ".join([LONG_PARAGRAPH] * 5).split()
    for n in range(len(words), 0, -1):
        text = " ".join(words[:n])
        if len(tok(text)["input_ids"]) == LONG_TOKENS:
            return text
    raise RuntimeError("no prefix of the paragraph has exactly LONG_TOKENS tokens")


CASES = [
    # name, text a, text b (or [a1, a2] for a pair encoding), method, steps, layer, baseline
    ("pairwise_guitar", "A man is playing a guitar.", "Someone plays the guitar on stage.",
     "pairwise", 32, 0, "pad"),
    ("pairwise_rare_word", "The axolotl slept quietly.", "Bond yields rose after the axolotl "
     "report.", "pairwise", 32, 0, "pad"),
    ("pairwise_wordpieces", "Photosynthesis converts sunlight.",
     "Chlorophyll absorbs light for plants.", "pairwise", 32, 0, "pad"),
    ("pairwise_layer3", "The cat sat on the mat.", "A kitten is resting on a rug.",
     "pairwise", 32, 3, "pad"),
    ("pairwise_mask_baseline", "How do I reset my password?", "Steps to recover account "
     "access.", "pairwise", 32, 0, "mask"),
    ("pairwise_zero_baseline", "Cheap flights to Paris", "Low-cost airline tickets to France",
     "pairwise", 32, 0, "zero"),
    ("pairwise_8_steps", "The stock market crashed.", "Shares fell sharply today.",
     "pairwise", 8, 0, "pad"),
    ("ig_long_256", "LONG", "water shortage and desalination costs",
     "integrated_gradients", 32, 0, "pad"),
    ("ig_pair_encoding", ["What is the capital of France?", "Paris is the capital."],
     "French capital city", "integrated_gradients", 32, 0, "pad"),
    ("ig_last_layer", "Dogs are loyal animals.", "Puppies love their owners.",
     "integrated_gradients", 32, 6, "pad"),
    ("gxi_simple", "Fresh bread from the bakery.", "A loaf baked this morning.",
     "gradient_x_input", 1, 0, "pad"),
    ("ig_64_steps", "Quantum computers use qubits.", "Superposition enables parallel "
     "computation.", "integrated_gradients", 64, 2, "pad"),
]


def encode(tok, text):
    if isinstance(text, list):
        return tok(text[0], text[1], add_special_tokens=True, return_offsets_mapping=True)
    return tok(text, add_special_tokens=True, return_offsets_mapping=True)


class Side:
    def __init__(self, model, tok, text, layer, baseline, m):
        enc = encode(tok, text)
        self.ids = enc["input_ids"]
        self.type_ids = enc["token_type_ids"]
        special = set(tok.all_special_ids) & {tok.cls_token_id, tok.sep_token_id}
        filler = tok.mask_token_id if baseline == "mask" else tok.pad_token_id
        base_ids = [i if i in special else filler for i in self.ids]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([self.ids, base_ids]),
                        token_type_ids=torch.tensor([self.type_ids] * 2),
                        output_hidden_states=True, return_dict=True)
        hs = out.hidden_states[layer]
        self.x = hs[0].clone()
        self.r = torch.zeros_like(self.x) if baseline == "zero" else hs[1].clone()
        self.m = m
        self.layer = layer
        alphas = torch.tensor([(m - k) / m for k in range(m + 1)], dtype=torch.float32)
        self.path = (self.r.unsqueeze(0) + alphas[:, None, None] * (self.x - self.r).unsqueeze(0))
        self.path = self.path.detach().requires_grad_(True)
        self.f = embed_from(model, layer, self.path)  # (m + 1, H)


def embed_from(model, layer, hidden):
    h = hidden
    for layer_module in model.encoder.layer[layer:]:
        h = layer_module(h)[0]
    return F.normalize(h.mean(dim=1), p=2, dim=1)


def forward_mode_u(model, side):
    """u (T, D): u[i] = (1/m) sum_k J_f(path_k)[:, i] (x - r)[i], by forward-mode autograd."""
    T, H = side.x.shape
    dx = side.x - side.r
    tangent = torch.zeros(T, T, H)
    for i in range(T):
        tangent[i, i] = dx[i]
    u = 0
    for k in range(side.m):
        alpha = (side.m - k) / side.m
        point = (side.r + alpha * (side.x - side.r)).detach()
        with fwAD.dual_level():
            dual = fwAD.make_dual(point.expand(T, T, H).contiguous(), tangent)
            df = fwAD.unpack_dual(embed_from(model, side.layer, dual)).tangent  # (T, D)
        u = u + df.detach() / side.m
    return u


def reverse_mode_u(side, dims):
    """The same u as the method's reference code builds it: one backward per output dim."""
    u = torch.zeros(side.x.shape[0], len(dims))
    dx = side.x - side.r
    for col, d in enumerate(dims):
        (g,) = torch.autograd.grad(side.f[:side.m, d].sum(), side.path, retain_graph=True)
        u[:, col] = (g[:side.m].mean(dim=0) * dx).sum(dim=1)
    return u


def run_case(model, tok, name, text_a, text_b, method, m, layer, baseline):
    a = Side(model, tok, text_a, layer, baseline, m)
    b = Side(model, tok, text_b, layer, baseline, m)
    fa, fb = a.f[0].detach(), b.f[0].detach()
    fra, frb = a.f[m].detach(), b.f[m].detach()
    out = {
        "name": name, "text_a": text_a, "text_b": text_b, "method": method, "steps": m,
        "layer": layer, "baseline": baseline, "ids_a": a.ids, "ids_b": b.ids,
        "similarity": float(fa @ fb), "s_ra_b": float(fra @ fb), "s_a_rb": float(fa @ frb),
        "s_ra_rb": float(fra @ frb),
    }
    for side, other, key in ((a, fb, "a"), (b, fa, "b")):
        s = (side.f[:m] @ other).sum()
        (g,) = torch.autograd.grad(s, side.path, retain_graph=True)
        g_mean = g[:m].mean(dim=0)
        out["gxi_" + key] = (side.x * g[0]).sum(dim=1).tolist()
        if method != "gradient_x_input":
            out["ig_" + key] = ((side.x - side.r) * g_mean).sum(dim=1).tolist()
    if method == "pairwise":
        A = forward_mode_u(model, a) @ forward_mode_u(model, b).T
        out["pair_matrix"] = A.tolist()
        target = out["similarity"] - out["s_ra_b"] - out["s_a_rb"] + out["s_ra_rb"]
        out["completeness_error"] = abs(float(A.sum()) - target)
    elif method == "integrated_gradients":
        out["completeness_error"] = max(
            abs(sum(out["ig_a"]) - (out["similarity"] - out["s_ra_b"])),
            abs(sum(out["ig_b"]) - (out["similarity"] - out["s_a_rb"])))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=os.path.join(REPO, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--out", default=os.path.join(HERE, "explain_cases.json"))
    ap.add_argument("--only", default="",
                    help="comma-separated case names: recompute those, keep the others from --out")
    args = ap.parse_args()
    torch.set_grad_enabled(True)
    tok = BertTokenizerFast.from_pretrained(args.model_dir)
    model = BertModel.from_pretrained(args.model_dir, attn_implementation="eager",
                                      torch_dtype=torch.float32)
    model.eval()
    for p in model.parameters():  # gradients w.r.t. the hidden states only
        p.requires_grad_(False)
    only = set(filter(None, args.only.split(",")))
    kept = {}
    if only:
        with open(args.out, encoding="utf-8") as f:
            kept = {c["name"]: c for c in json.load(f)["cases"]}
    cases = []
    for spec in CASES:
        if only and spec[0] not in only:
            cases.append(kept[spec[0]])
            continue
        t0 = time.time()
        spec = tuple(long_text(tok) if x == "LONG" else x for x in spec)
        cases.append(run_case(model, tok, *spec))
        c = cases[-1]
        print(f"{c['name']}: T {len(c['ids_a'])}x{len(c['ids_b'])} s {c['similarity']:.4f} "
              f"completeness error {c.get('completeness_error', 0):.2e} "
              f"({time.time() - t0:.1f} s)", file=sys.stderr)
    # Forward-mode u == the reference code's reverse-mode u (every 8th output dim), small case.
    check = Side(model, tok, "A red car.", 0, "pad", 4)
    dims = list(range(0, check.f.shape[1], 8))
    fwd, rev = forward_mode_u(model, check)[:, dims], reverse_mode_u(check, dims)
    reverse_check = float((fwd - rev).abs().max() / rev.abs().max())
    print(f"forward- vs reverse-mode u: max rel diff {reverse_check:.2e}", file=sys.stderr)
    assert reverse_check < 1e-4, reverse_check
    doc = {
        "generator": "tests/golden/make_explain_golden.py",
        "model_sha256": sha256_file(os.path.join(args.model_dir, "model.safetensors")),
        "versions": library_versions(),
        "reverse_mode_check": {"text": "A red car.", "steps": 4, "dims": "every 8th",
                               "max_rel_diff_forward_vs_reverse": reverse_check},
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
