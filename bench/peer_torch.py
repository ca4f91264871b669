#!/usr/bin/env python3
"""PyTorch eager peer of the benchmark harness: a worker (bench/peer_worker.py protocol) running
Hugging Face BertModel (fp32, attn_implementation="eager") from the same model directory.

--mode infer: forward + sentence-transformers mean pooling + L2 normalise under
  torch.inference_mode(); batches right-padded to their longest sequence with an attention mask.
--mode train: one fine-tuning step per run, the step attn-bench-train times: one forward over the
  anchors and positives, mean pooling + F.normalize, MultipleNegativesRankingLoss (cross-entropy
  over 20 x cosine, in-batch negatives), backward, clip_grad_norm_(1.0), AdamW (lr 2e-5, eps
  1e-6, weight decay 0.01 except biases and LayerNorm) over every parameter, zero_grad. Dropout
  off, no pooler (MNRL with mean pooling never uses it; attnserve has none).

Debian's python3-torch needs OpenBLAS (libopenblas0-openmp) and, on CPUs OpenBLAS 0.3.21 does
not know, OPENBLAS_CORETYPE=SkylakeX for fair numbers (bench/run.sh sets both; see
../shared/DESIGN.md "Performance peers").
"""
import argparse
import os

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModel

from peer_worker import Worker, padded, protocol_stream

MNRL_SCALE = 20.0


def mean_pool(hidden, mask):
    """Sentence-transformers' mean pooling: sum of token states over the mask / token count."""
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def param_groups(model, weight_decay):
    """Sentence-transformers' two groups: no decay for biases and LayerNorm weights."""
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not any(nd in n for nd in no_decay)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]


def tensors(sequences):
    ids, mask = padded(sequences)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


class TorchInferWorker(Worker):
    def __init__(self, model_dir, threads):
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity_error()
        self.model = AutoModel.from_pretrained(model_dir, attn_implementation="eager",
                                               add_pooling_layer=False).eval()
        self.inputs = {}
        self.info = {"engine": "pytorch-eager", "torch": torch.__version__,
                     "transformers": transformers.__version__, "threads": threads,
                     "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}

    def prepare(self, workloads):
        self.inputs = {name: tensors(spec["sequences"])
                       for name, spec in workloads.items() if "sequences" in spec}

    def run(self, name):
        ids, mask = self.inputs[name]
        with torch.inference_mode():
            types = ({} if self.model.config.model_type == "mpnet"  # MPNet has no token types
                     else {"token_type_ids": torch.zeros_like(ids)})
            hidden = self.model(input_ids=ids, attention_mask=mask, **types).last_hidden_state
            return F.normalize(mean_pool(hidden, mask), p=2, dim=1)

    def embed(self, name):
        return self.run(name).tolist()


class TorchTrainWorker(Worker):
    def __init__(self, model_dir, threads):
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity_error()
        self.model = AutoModel.from_pretrained(model_dir, attn_implementation="eager",
                                               add_pooling_layer=False, hidden_dropout_prob=0.0,
                                               attention_probs_dropout_prob=0.0)
        self.model.train()  # dropout probabilities are 0, so train mode is deterministic
        for p in self.model.parameters():
            p.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(param_groups(self.model, 0.01), lr=2e-5, eps=1e-6)
        self.batches = {}
        self.last_extra = {}
        self.info = {"engine": "pytorch-train", "torch": torch.__version__,
                     "transformers": transformers.__version__, "threads": threads,
                     "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}

    def prepare(self, workloads):
        # Anchors are rows [0, N), positives rows [N, 2N): one forward for both
        # (sentence-transformers runs one per column; same work, fewer small launches).
        self.batches = {name: (tensors(spec["anchors"] + spec["positives"]), len(spec["anchors"]))
                        for name, spec in workloads.items() if "anchors" in spec}

    def run(self, name):
        (ids, mask), pairs = self.batches[name]
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (2N, T, H)
        embeddings = F.normalize(mean_pool(hidden, mask), p=2, dim=1)              # (2N, H)
        anchors, positives = embeddings[:pairs], embeddings[pairs:]
        scores = MNRL_SCALE * anchors @ positives.t()  # (N, N), cos of unit vectors
        loss = F.cross_entropy(scores, torch.arange(pairs))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self.last_extra = {"loss": loss.item()}

    def embed(self, name):
        raise ValueError("the train worker does not embed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--mode", choices=["infer", "train"], default="infer")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = protocol_stream()
    worker_class = TorchInferWorker if args.mode == "infer" else TorchTrainWorker
    worker_class(args.model_dir, args.threads).serve(out)


if __name__ == "__main__":
    main()
