"""Held-out data for Client.evaluate and Client.finetune(eval_data=...), and their results.

A JSON Lines file (attnctl eval's format), an iterable of dicts, or an EvaluationSet message.
The task is told from the first object's fields:
  retrieval            {"query": ..., "item": ...} (the item relevant to the query); {"item": ...}
                       alone adds a distractor. The corpus is every distinct item.
  contrastive pairs    {"anchor", "positive"[, "negative"]}: each anchor retrieves its positive
                       among every positive and negative
  cosine similarity    {"first", "second", "score"}
  classification       {"text", "label"}
  pair classification  {"first", "second", "label"}
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Iterable, List, Union

import numpy as np

from attnserve.errors import quote
from attnserve.v1 import trainer_pb2 as tpb

EvaluationData = Union[str, "os.PathLike[str]", Iterable[Dict[str, Any]], tpb.EvaluationSet]

TASK_NAMES = {
    tpb.EVALUATION_RETRIEVAL: "retrieval",
    tpb.EVALUATION_COSINE_SIMILARITY: "cosine_similarity",
    tpb.EVALUATION_CLASSIFICATION: "classification",
    tpb.EVALUATION_PAIR_CLASSIFICATION: "pair_classification",
}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Scores of one version (evaluate) or of a job's weights after `step` steps (finetune)."""

    task: str
    # mrr@10, recall@1, recall@10, ndcg@10 | spearman | accuracy, macro_f1
    metrics: Dict[str, float]
    examples: int
    step: int
    model_version: str
    # evaluate() only, per example: the relevant item's rank, the cosine, or the predicted label.
    per_example: np.ndarray
    seconds: float


@dataclasses.dataclass(frozen=True)
class TrainingReport:
    """What the job that committed `version` recorded (Client.training_report)."""

    version: str
    settings: Dict[str, str]
    # Loss after each step, in order.
    losses: List[float]
    # The base's scores (step 0), every eval_every steps, the committed weights' last.
    evaluations: List[Evaluation]
    promotion: str
    # ||W - W0|| / ||W0|| per parameter group name ("layers.5.ffn_out", ...).
    relative_change: Dict[str, float]
    embedding_rows_changed: int


def report_from_proto(report: tpb.TrainingReport) -> TrainingReport:
    return TrainingReport(version=report.version, settings=dict(report.settings),
                          losses=[p.loss for p in report.loss_curve],
                          evaluations=[from_proto(e) for e in report.evaluations],
                          promotion=report.promotion,
                          relative_change={g.name: g.relative_change
                                           for g in report.relative_change},
                          embedding_rows_changed=report.embedding_rows_changed)


def from_proto(result: tpb.EvaluationResult) -> Evaluation:
    return Evaluation(task=TASK_NAMES.get(result.task, "unknown"),
                      metrics={m.name: m.value for m in result.metrics},
                      examples=result.examples, step=result.step,
                      model_version=result.model_version,
                      per_example=np.asarray(result.per_example, dtype=np.float64),
                      seconds=result.seconds)


def _objects(data: Union[str, "os.PathLike[str]", Iterable[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    if not isinstance(data, (str, os.PathLike)):
        return list(data)
    path = os.fspath(data)
    objects = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                objects.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
    return objects


def evaluation_set(data: EvaluationData) -> tpb.EvaluationSet:
    if isinstance(data, tpb.EvaluationSet):
        return data
    objects = _objects(data)
    if not objects or not all(isinstance(o, dict) for o in objects):
        raise ValueError("evaluation data: give one JSON object (dict) per example")
    first = objects[0]
    out = tpb.EvaluationSet()
    corpus: Dict[str, int] = {}

    def item(text: str) -> int:
        if text not in corpus:
            corpus[text] = len(out.corpus)
            out.corpus.append(text)
        return corpus[text]

    if "query" in first or set(first) == {"item"}:
        out.task = tpb.EVALUATION_RETRIEVAL
        for i, o in enumerate(objects):
            if "item" not in o:
                raise ValueError(f"evaluation example {i}: a retrieval line needs \"item\"")
            relevant = item(o["item"])
            if "query" in o:
                out.queries.append(o["query"])
                out.relevant.append(relevant)
    elif "anchor" in first:
        out.task = tpb.EVALUATION_RETRIEVAL
        for o in objects:
            out.queries.append(o["anchor"])
            out.relevant.append(item(o["positive"]))
            if o.get("negative"):
                item(o["negative"])
    else:
        if "text" in first:
            out.task = tpb.EVALUATION_CLASSIFICATION
        elif "score" in first:
            out.task = tpb.EVALUATION_COSINE_SIMILARITY
        elif "label" in first:
            out.task = tpb.EVALUATION_PAIR_CLASSIFICATION
        else:
            raise ValueError(f"evaluation data: cannot tell the task from the fields "
                             f"{quote(', '.join(sorted(first)))}; see "
                             "help(attnserve.Client.evaluate)")
        for o in objects:
            out.examples.append(tpb.TrainingExample(**o))
    return out
