#!/usr/bin/env python3
"""Generate tier-2 gradient-parity fixtures for attnserve's fine-tuning.

Reference: Hugging Face BertModel (models/all-MiniLM-L6-v2), float32, train()
mode with every dropout probability set to 0, eager attention. The loss
objectives are sentence-transformers' MultipleNegativesRankingLoss and
CosineSimilarityLoss, both on mean-pooled, L2-normalised embeddings. The full
description is in tests/golden/README_grad.md. What follows is the exact format.

OUTPUT FILES
  tests/golden/grad_cases.json          metadata, texts, ids, losses, norms
  tests/golden/grad_golden.safetensors  tensors (F32 values, I64 indices, LE)

PIPELINE (the same for every case)
  Every text is tokenised alone: BertTokenizerFast, add_special_tokens,
  truncation=True (right), max_length=256, no padding. token_type_ids are all 0.
  Each group of sequences (anchors, positives, negatives, sentences1,
  sentences2) goes through BertModel as one batch. The batch is right-padded
  with [PAD]=0 to the longest sequence in that group, attention_mask is 1 on
  real tokens, and the groups run in that order, as sentence-transformers does.
  Padding does not change the results: the script checks this by re-running
  every sequence alone with no padding.
    emb_raw = sum_t(h_t * mask_t) / max(sum_t mask_t, 1e-9)    (mean pooling)
    emb     = emb_raw / max(||emb_raw||_2, 1e-12)               (F.normalize)
  objective "multiple_negatives_ranking" (MNRL, scale 20, cos_sim):
    C      = concat(positives, negatives if any)                [A + N, 384]
    scores = 20 * cos_sim(anchors, C)                           [A, A + N]
    loss   = mean_i CE(scores[i], label i)     (cross-entropy, labels arange(A))
  objective "cosine_similarity" (CosineSimilarityLoss):
    cos    = torch.cosine_similarity(emb(sentences1), emb(sentences2))  [P]
    loss   = mean_i (cos_i - label_i)^2                          (MSELoss)

PARAMETERS
  These are the HF names without the "bert." prefix, in named_parameters()
  order, e.g. encoder.layer.0.attention.self.query.weight. pooler.dense.* is
  not in the graph (mean pooling ignores it). Its grad is None, clipping ignores
  it, and AdamW skips it, so it stays bit-identical with no weight decay. No
  grad tensors are stored for the pooler.
  Every other parameter gets a storage kind (the "storage" field in the JSON):
    "full"    numel <= 4096: the whole gradient is stored
    "sampled" numel > 4096: 512 flat (row-major) indices, drawn once per
              parameter with numpy default_rng(SAMPLE_SEED) in named_parameters
              order, then sorted. They are the same indices in every case.
    embeddings.word_embeddings.weight and embeddings.position_embeddings.weight
    are "sampled" AND also get "rows": the complete rows of the token ids the
    case uses (sorted, unique), or rows 0..max_len-1 for positions. All other
    rows of the word embedding gradient are exactly 0. The [PAD] row (id 0) is
    always 0 because nn.Embedding has padding_idx=0.
  The JSON holds the float64 Frobenius norm of every gradient (grad_norms).
  encoder.layer.*.attention.self.key.bias has an exact gradient of 0 (softmax
  does not change when the same value is added to every score of a row). The
  stored values are fp32 round-off (|g| up to about 2e-8). Compare them
  in absolute terms, never relatively. The JSON marks these with
  "exact_grad_is_zero": true.

SAFETENSORS NAMES  (<c> = case name, <p> = parameter name)
  <c>.loss                       F32 [1]        the loss of the fp32 run
  <c>.emb.<group>                F32 [n, 384]   normalised embeddings
  <c>.d_emb.<group>              F32 [n, 384]   dLoss/d(normalised embedding);
                                                cos_sim normalises again, so
                                                this is orthogonal to emb
  <c>.scores                     F32 [A, A+N]   MNRL: 20*cos (the logits)
                                 F32 [P]        cosine: cos(u, v)
  <c>.grad.<p>                   F32 shape(p)   storage "full"
  <c>.grad.<p>                   F32 [R, 384]   row subset (word/position emb.)
  <c>.grad_rows.<p>              I64 [R]        the rows of <c>.grad.<p>
  <c>.grad_idx.<p>               I64 [512]      flat indices (storage "sampled")
  <c>.grad_val.<p>               F32 [512]      gradient values at grad_idx
  Only for the AdamW case (adamw.case in the JSON, the first case):
  <c>.after_step.<p>             F32            parameters after one AdamW
                                                step, "full" or rows (the same
                                                rows as grad_rows)
  <c>.after_step_val.<p>         F32 [512]      parameters after the step,
                                                at grad_idx

ADAMW STEP (on the first case's fp32 gradients)
  torch.nn.utils.clip_grad_norm_(max_norm=1.0) over every parameter that has a
  grad: total = ||concat(all grads)||_2, coef = min(1, 1 / (total + 1e-6)),
  g *= coef. Then torch.optim.AdamW(lr=2e-5, betas=(0.9, 0.999), eps=1e-6)
  with two param groups: weight_decay 0.01, and 0.0 for names containing
  "bias", "LayerNorm.bias" or "LayerNorm.weight". For step t=1 with zero state,
  per element:
    p  = p * (1 - lr * wd)                 (decoupled decay FIRST)
    m  = (1 - b1) g ; v = (1 - b2) g^2
    p  = p - (lr / (1 - b1)) * m / (sqrt(v) / sqrt(1 - b2) + eps)
  The eps is added after the bias correction of sqrt(v). Where g == 0 exactly,
  the result is bit-exact: p_after = p * float32(1 - lr*wd) (asserted).

RUN (never run by CI; uses the venv from setup_venv.sh; takes about 45 s)
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OPENBLAS_CORETYPE=SkylakeX \\
      .venv-golden/bin/python tests/golden/make_grad_golden.py \\
      [--model-dir models/all-MiniLM-L6-v2] [--out-dir tests/golden]

SELF-CHECKS (each is asserted before anything is written)
  * The token ids equal sentence-transformers' tokenize().
  * The loss and gradients equal those from sentence-transformers' own loss
    modules on a SentenceTransformer in eval() mode.
  * Padding does not matter: running every sequence alone (batch 1, no
    padding) gives the same loss and gradients.
  * A float64 copy of the model: the autograd gradient of chosen scalars (a
    LayerNorm weight, a query weight, an FFN bias, a word-embedding entry)
    matches a central finite difference (rel err < 1e-6). The recorded fp32
    gradient matches the float64 FD estimate within rel err < 1e-2 (in
    practice about 2e-6).
  * Unused word-embedding rows, the [PAD] row and positions >= max_len have an
    exactly zero gradient. The key-bias gradients are round-off
    (< 1e-5 * the case's largest |grad|).
  * The pooler is unchanged by the step, and zero-gradient elements are
    exactly p * float32(1 - lr*wd).
  * The safetensors file reads back bit-identical.
"""

import argparse
import copy
import os
import struct
import sys
import time

# Offline only, and one thread so that the output is reproducible.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from golden_common import (library_versions, sha256_file,  # noqa: E402
                           write_fixture)
from sentence_transformers import SentenceTransformer, losses  # noqa: E402
from transformers import BertModel, BertTokenizerFast  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

MAX_LENGTH = 256
MNRL_SCALE = 20.0
FULL_THRESHOLD = 4096
NUM_SAMPLES = 512
SAMPLE_SEED = 20240611
MIN_TOKENS, MAX_TOKENS = 6, 16

ADAMW = dict(lr=2e-5, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
NO_DECAY = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
MAX_GRAD_NORM = 1.0

WORD_EMB = "embeddings.word_embeddings.weight"
POS_EMB = "embeddings.position_embeddings.weight"

FD_STEP = 1e-5           # central difference step in float64
FD_REL_TOL_F64 = 1e-6    # FD vs float64 autograd
FD_REL_TOL_F32 = 1e-2    # FD (float64) vs the recorded fp32 gradient
PAD_REL_TOL = 1e-4       # padded batch vs per-sequence, relative Frobenius
LOSS_REL_TOL = 1e-5      # loss: padded vs unpadded, ours vs ST
ST_REL_TOL = 1e-5        # our pipeline vs sentence-transformers' loss module
ZERO_GRAD_REL_TOL = 1e-5  # max|g key.bias| / max|any g| (exactly 0 in theory)


def build_cases():
    """The first case is also the AdamW case."""
    return [
        # Confusable pairs (two about music, two about resting animals), so
        # the loss is well away from 0 and fp32 stays well conditioned.
        dict(name="mnrl_pairs", objective="multiple_negatives_ranking",
             groups=[
                 ("anchors", [
                     "A man is playing a guitar.",
                     "A woman plays the piano at a concert.",
                     "The cat sleeps.",
                     "A dog is lying on the sofa in the living room.",
                 ]),
                 ("positives", [
                     "Someone is strumming an acoustic guitar on a small "
                     "wooden stage.",
                     "A musician performs for a large audience.",
                     "A pet is resting.",
                     "An animal naps indoors.",
                 ]),
             ]),
        # Near-miss hard negatives; two of the three beat their positive.
        dict(name="mnrl_hard_negatives", objective="multiple_negatives_ranking",
             groups=[
                 ("anchors", [
                     "What is the capital of France?",
                     "Children are playing football in the park.",
                     "A woman is slicing tomatoes in the kitchen.",
                 ]),
                 ("positives", [
                     "Paris is the capital and largest city of France.",
                     "Kids kick a ball around on the grass.",
                     "Someone cuts vegetables with a knife.",
                 ]),
                 ("negatives", [
                     "What is the capital of Germany?",
                     "Children are playing basketball in the park.",
                     "A woman is slicing bread in the kitchen.",
                 ]),
             ]),
        dict(name="cosine_similarity", objective="cosine_similarity",
             groups=[
                 ("sentences1", [
                     "The weather is lovely today.",
                     "The new phone has an impressive battery life.",
                     "He plays the violin every evening.",
                 ]),
                 ("sentences2", [
                     "It is a beautiful sunny day.",
                     "I forgot my umbrella at home.",
                     "Music lessons are held on weekends.",
                 ]),
             ],
             labels=[0.9, 0.1, 0.5]),
    ]


# ---------------------------------------------------------------- model ----

def load_model(model_dir, dtype):
    model = BertModel.from_pretrained(
        model_dir, attn_implementation="eager", torch_dtype=torch.float32,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        add_pooling_layer=True)
    assert model.config._attn_implementation == "eager"
    model.train()  # train mode; every dropout has p = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            assert m.p == 0.0, m
    return model.to(dtype)


def encode_group(model, id_lists, dtype, padded=True):
    """Token id lists -> normalised embeddings [n, H] (and the raw means)."""
    if not padded:
        outs = [encode_group(model, [ids], dtype, padded=True)[0]
                for ids in id_lists]
        return torch.cat(outs, 0), None
    n = len(id_lists)
    s = max(len(x) for x in id_lists)
    input_ids = torch.zeros((n, s), dtype=torch.long)
    mask = torch.zeros((n, s), dtype=torch.long)
    for i, ids in enumerate(id_lists):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        mask[i, :len(ids)] = 1
    out = model(input_ids=input_ids, attention_mask=mask,
                token_type_ids=torch.zeros_like(input_ids), return_dict=True)
    h = out.last_hidden_state                                   # [n, S, H]
    m = mask.unsqueeze(-1).to(h.dtype)                          # [n, S, 1]
    raw = (h * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)      # [n, H]
    return F.normalize(raw, p=2, dim=1), raw


def case_loss(model, case, dtype, padded=True):
    """Returns loss, {group: normalised emb (retain_grad)}, scores."""
    embs = {}
    for gname, _ in case["groups"]:
        e, _ = encode_group(model, case["ids"][gname], dtype, padded)
        if e.requires_grad:
            e.retain_grad()
        embs[gname] = e
    if case["objective"] == "multiple_negatives_ranking":
        a = embs["anchors"]
        cand = torch.cat([embs[g] for g, _ in case["groups"][1:]], 0)
        scores = torch.mm(F.normalize(a, p=2, dim=1),
                          F.normalize(cand, p=2, dim=1).t()) * MNRL_SCALE
        labels = torch.arange(a.shape[0], dtype=torch.long)
        loss = F.cross_entropy(scores, labels)  # mean reduction
    else:
        cos = torch.cosine_similarity(embs["sentences1"], embs["sentences2"])
        labels = torch.tensor(case["labels"], dtype=dtype)
        loss = F.mse_loss(cos, labels)           # mean reduction
        scores = cos
    return loss, embs, scores


def grads_of(model, case, dtype, padded=True):
    model.zero_grad(set_to_none=True)
    loss, embs, scores = case_loss(model, case, dtype, padded)
    loss.backward()
    grads = {n: (None if p.grad is None else p.grad.detach().clone())
             for n, p in model.named_parameters()}
    return loss.detach(), embs, scores.detach(), grads


def rel_fro(a, b):
    a = a.double()
    b = b.double()
    den = float(torch.linalg.norm(b))
    num = float(torch.linalg.norm(a - b))
    return num / den if den > 0 else num


# ----------------------------------------------------------------- checks ---

def is_zero_grad_param(name):
    """Parameters whose exact gradient is 0 (so only round-off is stored).

    The key bias adds q . b_k to every score of a query row, and softmax does
    not change under a shift, so dLoss/d(key.bias) = 0 exactly. The computed
    values are round-off (about 1e-13 per element in fp32).
    """
    return name.endswith("attention.self.key.bias")


def compare_grads(a, b):
    """Max relative Frobenius error over the parameters, and max abs error
    of the exactly-zero ones (key biases), where relative errors mean nothing.
    """
    res = dict(max_rel_fro=0.0, worst_param=None, zero_grad_max_abs=0.0)
    for n, g in b.items():
        if g is None:
            continue
        if is_zero_grad_param(n):
            res["zero_grad_max_abs"] = max(
                res["zero_grad_max_abs"], float(a[n].abs().max()),
                float(g.abs().max()))
            continue
        r = rel_fro(a[n], g)
        if r > res["max_rel_fro"]:
            res["max_rel_fro"], res["worst_param"] = r, n
    return res



def st_reference(st, case):
    """Loss and grads from sentence-transformers' own loss module."""
    feats = []
    for gname, texts in case["groups"]:
        f = st.tokenize(texts)
        ids = f["input_ids"]
        m = f["attention_mask"]
        for i, ref in enumerate(case["ids"][gname]):
            got = ids[i][m[i].bool()].tolist()
            assert got == ref, (case["name"], gname, i, got, ref)
        feats.append(dict(f))
    if case["objective"] == "multiple_negatives_ranking":
        lf = losses.MultipleNegativesRankingLoss(st, scale=MNRL_SCALE)
        labels = None
    else:
        lf = losses.CosineSimilarityLoss(st)
        labels = torch.tensor(case["labels"], dtype=torch.float32)
    st.zero_grad(set_to_none=True)
    loss = lf(feats, labels)
    loss.backward()
    prefix = "0.auto_model."
    grads = {n[len(prefix):]: (None if p.grad is None else p.grad.clone())
             for n, p in st.named_parameters()}
    return loss.detach(), grads


def fd_check(model64, case, name, flat_idx, g32, g64):
    p = dict(model64.named_parameters())[name]
    flat = p.data.view(-1)
    orig = float(flat[flat_idx])
    with torch.no_grad():
        flat[flat_idx] = orig + FD_STEP
        lp = float(case_loss(model64, case, torch.float64)[0])
        flat[flat_idx] = orig - FD_STEP
        lm = float(case_loss(model64, case, torch.float64)[0])
        flat[flat_idx] = orig
    fd = (lp - lm) / (2 * FD_STEP)
    a64 = float(g64[name].view(-1)[flat_idx])
    a32 = float(g32[name].view(-1)[flat_idx])
    r64 = abs(a64 - fd) / max(abs(fd), 1e-30)
    r32 = abs(a32 - fd) / max(abs(fd), 1e-30)
    res = dict(param=name, flat_index=int(flat_idx), fd_float64=fd,
               autograd_float64=a64, recorded_float32=a32,
               rel_err_f64=r64, rel_err_f32=r32, step=FD_STEP)
    assert r64 < FD_REL_TOL_F64, res
    assert r32 < FD_REL_TOL_F32, res
    return res


# ----------------------------------------------------------------- helpers --

def f32_hex(x):
    return struct.pack(">f", float(x)).hex()


def f32(t):
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32)


def i64(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.int64))


# ------------------------------------------------------------------- main ---

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir",
                    default=os.path.join(REPO, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--out-dir", default=HERE)
    args = ap.parse_args()
    model_dir = os.path.abspath(args.model_dir)
    t0 = time.time()
    torch.manual_seed(0)

    tok = BertTokenizerFast.from_pretrained(model_dir)
    model = load_model(model_dir, torch.float32)
    model64 = load_model(model_dir, torch.float64)
    st = SentenceTransformer(model_dir, device="cpu")
    st.eval()  # dropout off, autograd still on
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling",
                                              "Normalize"]
    assert st.max_seq_length == MAX_LENGTH
    hidden = model.config.hidden_size

    # Parameter table and sampled indices (fixed once, shared by all cases).
    rng = np.random.default_rng(SAMPLE_SEED)
    params = []
    sample_idx = {}
    for n, p in model.named_parameters():
        numel = p.numel()
        in_graph = not n.startswith("pooler.")
        storage = "full" if numel <= FULL_THRESHOLD else "sampled"
        if numel > FULL_THRESHOLD:
            sample_idx[n] = np.sort(rng.choice(numel, size=NUM_SAMPLES,
                                               replace=False)).astype(np.int64)
        entry = dict(name=n, shape=list(p.shape), numel=numel,
                     storage=storage if in_graph else "none",
                     rows=("token_ids" if n == WORD_EMB else
                           "positions" if n == POS_EMB else None),
                     weight_decay=(0.0 if any(nd in n for nd in NO_DECAY)
                                   else ADAMW["weight_decay"]),
                     in_graph=in_graph,
                     exact_grad_is_zero=is_zero_grad_param(n))
        params.append(entry)
    pinfo = {e["name"]: e for e in params}

    cases = build_cases()
    tensors = {}
    cases_json = []
    first_grads = None
    for ci, case in enumerate(cases):
        name = case["name"]
        # Tokenise every text alone.
        case["ids"] = {}
        groups_json = []
        for gname, texts in case["groups"]:
            ids_list = []
            for t in texts:
                enc = tok(t, add_special_tokens=True, truncation=True,
                          max_length=MAX_LENGTH, padding=False)
                ids = enc["input_ids"]
                assert MIN_TOKENS <= len(ids) <= MAX_TOKENS, (t, len(ids))
                assert ids[0] == tok.cls_token_id
                assert ids[-1] == tok.sep_token_id
                assert tok.pad_token_id not in ids
                assert all(x == 0 for x in enc["token_type_ids"])
                ids_list.append(ids)
            case["ids"][gname] = ids_list
            groups_json.append(dict(
                name=gname, texts=texts, input_ids=ids_list,
                lengths=[len(x) for x in ids_list],
                tokens=[tok.convert_ids_to_tokens(x) for x in ids_list]))
        all_ids = [x for g, _ in case["groups"] for x in case["ids"][g]]
        used_rows = sorted(set(i for x in all_ids for i in x))
        max_len = max(len(x) for x in all_ids)

        # fp32 reference run (padded per group, as sentence-transformers does).
        loss, embs, scores, grads = grads_of(model, case, torch.float32)
        assert torch.isfinite(loss)
        gmax = max(float(g.abs().max()) for g in grads.values()
                   if g is not None)
        zero_tol = ZERO_GRAD_REL_TOL * gmax
        if ci == 0:
            first_grads = grads

        # Check 1: sentence-transformers' own loss module.
        st_loss, st_grads = st_reference(st, case)
        for n, g in grads.items():
            assert (g is None) == (st_grads[n] is None), n
        st_check = compare_grads(st_grads, grads)
        st_check["loss_abs_diff"] = abs(float(st_loss) - float(loss))
        loss_tol = LOSS_REL_TOL * abs(float(loss))
        assert st_check["loss_abs_diff"] < loss_tol, st_check
        assert st_check["max_rel_fro"] < ST_REL_TOL, st_check
        assert st_check["zero_grad_max_abs"] < zero_tol, st_check

        # Check 2: padding must not matter (every sequence alone, unpadded).
        u_loss, _, _, u_grads = grads_of(model, case, torch.float32,
                                         padded=False)
        pad_check = compare_grads(u_grads, grads)
        pad_check["loss_abs_diff"] = abs(float(u_loss) - float(loss))
        assert pad_check["loss_abs_diff"] < loss_tol, pad_check
        assert pad_check["max_rel_fro"] < PAD_REL_TOL, pad_check
        assert pad_check["zero_grad_max_abs"] < zero_tol, pad_check

        # Check 3: float64 model, autograd vs finite differences.
        loss64, _, _, grads64 = grads_of(model64, case, torch.float64)
        fp32_vs_fp64 = {}
        for n, g in grads.items():
            if g is not None:
                g64 = grads64[n]
                fp32_vs_fp64[n] = dict(
                    rel_fro=rel_fro(g, g64),
                    max_abs_err=float((g.double() - g64).abs().max()),
                    max_abs_fp64=float(g64.abs().max()))
        f64_summary = compare_grads(grads, grads64)
        f64_summary["loss_abs_diff"] = abs(float(loss64) - float(loss))
        assert f64_summary["zero_grad_max_abs"] < zero_tol
        fd = []
        for n in ["embeddings.LayerNorm.weight",
                  "encoder.layer.3.output.LayerNorm.weight",
                  "encoder.layer.0.attention.self.query.weight",
                  "encoder.layer.5.intermediate.dense.bias"]:
            k = int(grads64[n].abs().view(-1).argmax())
            fd.append(fd_check(model64, case, n, k, grads, grads64))
        # One word-embedding entry of a used token (not a special token).
        tid = [t for t in used_rows if t not in (tok.cls_token_id,
                                                 tok.sep_token_id)][0]
        col = int(grads64[WORD_EMB][tid].abs().argmax())
        fd.append(fd_check(model64, case, WORD_EMB, tid * hidden + col,
                           grads, grads64))

        # Word-embedding gradient is zero outside the used rows.
        gw = grads[WORD_EMB]
        nz_rows = torch.nonzero(gw.abs().sum(1)).view(-1).tolist()
        assert set(nz_rows) <= set(used_rows), set(nz_rows) - set(used_rows)
        assert float(gw[tok.pad_token_id].abs().max()) == 0.0
        gp = grads[POS_EMB]
        assert float(gp[max_len:].abs().max()) == 0.0

        # Store.
        p_ = f"{name}."
        tensors[p_ + "loss"] = f32(loss.view(1))
        for gname, _ in case["groups"]:
            tensors[p_ + "emb." + gname] = f32(embs[gname])
            tensors[p_ + "d_emb." + gname] = f32(embs[gname].grad)
        tensors[p_ + "scores"] = f32(scores)
        grad_norms = {}
        for n, g in grads.items():
            if g is None:
                continue
            grad_norms[n] = float(torch.linalg.norm(g.double()))
            e = pinfo[n]
            if e["storage"] == "full":
                tensors[f"{p_}grad.{n}"] = f32(g)
            else:
                idx = sample_idx[n]
                tensors[f"{p_}grad_idx.{n}"] = i64(idx)
                tensors[f"{p_}grad_val.{n}"] = f32(g.reshape(-1)[
                    torch.from_numpy(idx)])
            if e["rows"] is not None:
                rows = used_rows if n == WORD_EMB else list(range(max_len))
                tensors[f"{p_}grad_rows.{n}"] = i64(rows)
                tensors[f"{p_}grad.{n}"] = f32(g[torch.tensor(rows)])
        global_norm = float(torch.linalg.norm(torch.stack(
            [torch.linalg.norm(g.double()) for g in grads.values()
             if g is not None])))

        cj = dict(name=name, objective=case["objective"], groups=groups_json)
        if case["objective"] == "multiple_negatives_ranking":
            cj.update(scale=MNRL_SCALE, similarity="cos_sim",
                      candidates=[g for g, _ in case["groups"][1:]],
                      ce_labels=list(range(len(case["groups"][0][1]))))
        else:
            cj.update(labels=case["labels"])
        cj.update(
            loss=float(loss), loss_f32_hex=f32_hex(loss),
            loss_float64_model=float(loss64),
            word_embedding_rows=used_rows, position_rows=max_len,
            global_grad_norm=global_norm, max_abs_grad=gmax,
            grad_norms=grad_norms,
            checks=dict(sentence_transformers=st_check, padding=pad_check,
                        finite_difference=fd, fp32_vs_fp64=f64_summary,
                        fp32_vs_fp64_per_param=fp32_vs_fp64))
        cases_json.append(cj)
        print(f"{name:22s} loss={float(loss)!r} (fp64 model {float(loss64)!r})"
              f" |g|={global_norm:.6g} st_rel={st_check['max_rel_fro']:.2e} "
              f"pad_rel={pad_check['max_rel_fro']:.2e} fd_rel32="
              f"{max(r['rel_err_f32'] for r in fd):.2e} fd_rel64="
              f"{max(r['rel_err_f64'] for r in fd):.2e}", file=sys.stderr)

    # ------------------------------------------------ one AdamW step -------
    adam_case = cases_json[0]["name"]

    def adamw_step(grad_source):
        m = copy.deepcopy(model)
        m.zero_grad(set_to_none=True)
        named = dict(m.named_parameters())
        for n, p in named.items():
            g = grad_source[n]
            p.grad = None if g is None else g.to(torch.float32).clone()
        pre = float(torch.nn.utils.clip_grad_norm_(m.parameters(),
                                                   MAX_GRAD_NORM))
        groups = [
            {"params": [p for n, p in named.items()
                        if not any(nd in n for nd in NO_DECAY)],
             "weight_decay": ADAMW["weight_decay"]},
            {"params": [p for n, p in named.items()
                        if any(nd in n for nd in NO_DECAY)],
             "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=ADAMW["betas"],
                                eps=ADAMW["eps"], foreach=False)
        opt.step()
        return m, pre

    stepped, pre_clip = adamw_step(first_grads)
    stepped64, _ = adamw_step(
        grads_of(model64, dict(cases[0]), torch.float64)[3])
    before = dict(model.named_parameters())
    after = dict(stepped.named_parameters())
    after64 = dict(stepped64.named_parameters())
    sens = 0.0
    n_zero_exact = 0
    max_delta = 0.0
    for n, p in after.items():
        e = pinfo[n]
        if not e["in_graph"]:
            assert torch.equal(p, before[n]), n  # skipped by AdamW
            continue
        max_delta = max(max_delta, float((p - before[n]).abs().max()))
        # Where the gradient is exactly 0 (unused word-embedding rows, unused
        # positions, the [PAD] row, token type 1) the step is the decoupled
        # decay alone, bit-exact in fp32: p * float32(1 - lr*wd).
        g0 = first_grads[n] == 0
        if bool(g0.any()):
            decay = torch.tensor(1.0 - ADAMW["lr"] * e["weight_decay"],
                                 dtype=torch.float32)
            assert torch.equal(p.detach()[g0],
                               before[n].detach()[g0] * decay), n
            n_zero_exact += int(g0.sum())
        sens = max(sens, float((p - after64[n]).abs().max()))
        if e["storage"] == "full":
            tensors[f"{adam_case}.after_step.{n}"] = f32(p)
        else:
            idx = torch.from_numpy(sample_idx[n])
            tensors[f"{adam_case}.after_step_val.{n}"] = f32(
                p.detach().reshape(-1)[idx])
        if e["rows"] is not None:
            rows = (cases_json[0]["word_embedding_rows"] if n == WORD_EMB
                    else list(range(cases_json[0]["position_rows"])))
            tensors[f"{adam_case}.after_step.{n}"] = f32(p[torch.tensor(rows)])
    # As torch computes it: float32 tensor arithmetic.
    clip_coef = float(torch.clamp(
        MAX_GRAD_NORM / (torch.tensor(pre_clip, dtype=torch.float32) + 1e-6),
        max=1.0))
    assert abs(pre_clip - cases_json[0]["global_grad_norm"]) < 1e-5 * pre_clip
    adamw_json = dict(
        case=adam_case, lr=ADAMW["lr"], betas=list(ADAMW["betas"]),
        eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
        no_decay=NO_DECAY, max_grad_norm=MAX_GRAD_NORM,
        pre_clip_global_norm=pre_clip, clip_coef=clip_coef,
        clip_applied=pre_clip > MAX_GRAD_NORM, step=1, foreach=False,
        skipped_params=[e["name"] for e in params if not e["in_graph"]],
        decay_factor_f32=float(torch.tensor(
            1.0 - ADAMW["lr"] * ADAMW["weight_decay"], dtype=torch.float32)),
        zero_grad_elements_checked_bit_exact=n_zero_exact,
        max_abs_param_change=max_delta,
        after_step_max_abs_diff_fp64_grads=sens,
        order=("clip_grad_norm_ (coef = max_norm/(total+1e-6), clamped to "
               "<= 1); then per param: p *= 1 - lr*wd; m = (1-b1) g; "
               "v = (1-b2) g^2; "
               "p -= lr/(1-b1) * m / (sqrt(v)/sqrt(1-b2) + eps)"))
    print(f"adamw on {adam_case}: pre-clip norm {pre_clip!r} coef {clip_coef!r}"
          f" max |dp| {max_delta:.3g}, fp64-grad sensitivity {sens:.3g}",
          file=sys.stderr)

    versions = library_versions()
    doc = dict(
        generator="tests/golden/make_grad_golden.py",
        model=os.path.basename(model_dir.rstrip("/")),
        model_sha256=sha256_file(os.path.join(model_dir, "model.safetensors")),
        versions=versions,
        settings=dict(dtype="float32", dropout=0.0, mode="train",
                      attn_implementation="eager", max_length=MAX_LENGTH,
                      truncation_side="right", token_type_ids=0,
                      padding="per group to its longest, [PAD]=0, masked",
                      pooling="mean over attention_mask, clamp(count,1e-9)",
                      normalize="F.normalize p=2 eps=1e-12",
                      mnrl_scale=MNRL_SCALE, full_threshold=FULL_THRESHOLD,
                      num_samples=NUM_SAMPLES, sample_seed=SAMPLE_SEED,
                      sample_rng="numpy.random.default_rng(seed).choice("
                                 "numel, 512, replace=False), sorted, drawn "
                                 "per sampled param in named_parameters order",
                      fd_step=FD_STEP),
        params=params,
        adamw=adamw_json,
        cases=cases_json,
    )
    write_fixture(
        os.path.join(args.out_dir, "grad_cases.json"),
        os.path.join(args.out_dir, "grad_golden.safetensors"), doc, tensors,
        "tests/golden/make_grad_golden.py (%s; see grad_cases.json)"
        % doc["model"])
    print(f"done in {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
