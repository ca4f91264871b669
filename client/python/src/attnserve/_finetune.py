"""Training data for Client.finetune: JSON Lines files, dicts, tuples or TrainingExample messages."""
from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union, cast

from attnserve import _convert
from attnserve._evaluation import Evaluation
from attnserve.v1 import trainer_pb2 as tpb

OBJECTIVES = {
    "contrastive": tpb.CONTRASTIVE,
    "cosine": tpb.COSINE_SIMILARITY,
    "classification": tpb.CLASSIFICATION,
    "pair_classification": tpb.PAIR_CLASSIFICATION,
}
PARAMETERS = {
    "all": tpb.PARAMETERS_ALL,
    "attention_only": tpb.PARAMETERS_ATTENTION_ONLY,
    "all_but_embeddings": tpb.PARAMETERS_ALL_BUT_EMBEDDINGS,
    "head_only": tpb.PARAMETERS_HEAD_ONLY,
}
# Tuple fields by objective: ("anchor", "positive") etc.
_TUPLE_FIELDS: Dict[int, Tuple[str, ...]] = {
    tpb.CONTRASTIVE: ("anchor", "positive", "negative"),
    tpb.COSINE_SIMILARITY: ("first", "second", "score"),
    tpb.CLASSIFICATION: ("text", "label"),
    tpb.PAIR_CLASSIFICATION: ("first", "second", "label"),
}
_EXAMPLE_FIELDS = {f.name for f in tpb.TrainingExample.DESCRIPTOR.fields}

TrainingData = Union[str, "os.PathLike[str]", Iterable[Any]]


@dataclasses.dataclass(frozen=True)
class FineTuneResult:
    """What a finetune() job did."""

    job_id: str
    base_version: str
    # The new version, "" when the job was aborted (commit=False).
    committed_version: str
    steps: int
    # Loss after each step, in order.
    losses: List[float]
    # The server's notes on batches that may not teach the model anything.
    warnings: List[str]
    # With eval_data: the base's scores (step 0), every eval_every steps, the committed weights'.
    evaluations: List["Evaluation"] = dataclasses.field(default_factory=list)
    # Whether the commit made the version the default, and why (the gate's numbers).
    promoted: bool = False
    promotion: str = ""


def objective(value: Union[str, int]) -> "tpb.Objective":
    if isinstance(value, int):
        return cast("tpb.Objective", value)
    return _convert.lookup(OBJECTIVES, value, "objective")


def parameters(value: Union[str, int]) -> "tpb.ParameterSelection":
    if isinstance(value, int):
        return cast("tpb.ParameterSelection", value)
    return _convert.lookup(PARAMETERS, value, "parameters")


def example(item: Any, objective_value: int, where: str) -> tpb.TrainingExample:
    if isinstance(item, tpb.TrainingExample):
        return item
    if isinstance(item, dict):
        unknown = sorted(set(item) - _EXAMPLE_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; a training "
                             f"example has {', '.join(sorted(_EXAMPLE_FIELDS))}")
        return tpb.TrainingExample(**item)
    if isinstance(item, (tuple, list)):
        names = _TUPLE_FIELDS.get(objective_value, ())
        if not 2 <= len(item) <= len(names):
            raise ValueError(f"{where}: a tuple for this objective is ({', '.join(names)}), "
                             f"got {len(item)} values")
        return tpb.TrainingExample(**dict(zip(names, item)))
    raise TypeError(f"{where}: a training example is a dict, a tuple or a TrainingExample, not "
                    f"{type(item).__name__}")


def load(data: TrainingData, objective_value: int) -> List[tpb.TrainingExample]:
    """All examples: a JSON Lines path (one object per line, attnctl's format) or an iterable."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        examples = []
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
                examples.append(example(item, objective_value, f"{path}:{number}"))
    else:
        examples = [example(item, objective_value, f"example {i}")
                    for i, item in enumerate(data)]
    if not examples:
        raise ValueError("no training examples")
    return examples


def batches(examples: Sequence[tpb.TrainingExample], batch_size: int, epochs: int,
            shuffle: bool, seed: int) -> List[tpb.TrainingBatch]:
    if batch_size < 1 or epochs < 1:
        raise ValueError(f"batch_size {batch_size} and epochs {epochs} must be >= 1")
    out = []
    for epoch in range(epochs):
        order = list(range(len(examples)))
        if shuffle:
            random.Random(seed * 1000003 + epoch).shuffle(order)
        for start in range(0, len(order), batch_size):
            out.append(tpb.TrainingBatch(
                examples=[examples[i] for i in order[start:start + batch_size]]))
    return out


def config(objective_value: "tpb.Objective", *, learning_rate: float, num_labels: int,
           label_names: Optional[Sequence[str]], parameters_value: "tpb.ParameterSelection",
           seed: int,
           warmup_steps: int, total_steps: int, disable_dropout: bool,
           base_version: str, max_length: int) -> tpb.FineTuneConfig:
    from attnserve.v1 import encoder_pb2 as pb

    return tpb.FineTuneConfig(
        objective=objective_value, learning_rate=learning_rate, num_labels=num_labels,
        label_names=list(label_names or []), parameters=parameters_value, seed=seed,
        warmup_steps=warmup_steps, total_steps=total_steps, disable_dropout=disable_dropout,
        base_version=base_version, tokenization=pb.TokenizationOptions(max_length=max_length))
