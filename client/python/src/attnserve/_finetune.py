"""Training data for Client.finetune: JSON Lines files, dicts, tuples or TrainingExample messages."""
from __future__ import annotations

import dataclasses
import json
import os
import queue
from typing import (Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union,
                    cast)

import grpc

from attnserve import _convert
from attnserve._evaluation import Evaluation, EvaluationData, evaluation_set, from_proto
from attnserve.errors import error, quote
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
            raise ValueError(f"{where}: unknown field(s) {quote(', '.join(unknown))}; a training "
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


_MASK64 = (1 << 64) - 1


def _splitmix64(state: int) -> Tuple[int, int]:
    """One SplitMix64 step: (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def epoch_order(n: int, seed: int, epoch: int) -> List[int]:
    """The order attnctl and server-side jobs visit n examples in (engine/training/epoch_order.h):
    a Fisher-Yates shuffle driven by SplitMix64 seeded by (seed, epoch), so the same data, seed
    and batch size give the same batches from Python, attnctl or a detached job."""
    order = list(range(n))
    state, first = _splitmix64(seed & _MASK64)
    state = first ^ ((epoch * 0xD1B54A32D192ED03) & _MASK64)
    limit_base = _MASK64
    for i in range(n, 1, -1):
        limit = limit_base - limit_base % i  # rejection sampling: no modulo bias
        while True:
            state, r = _splitmix64(state)
            if r < limit:
                break
        j = r % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def epoch_batches(n: int, batch_size: int, min_batch: int = 1) -> List[Tuple[int, int]]:
    """[begin, end) ranges of batch_size; a last batch short of min_batch borrows from the one
    before it (9 contrastive pairs in batches of 4: 4, 3, 2), as attnctl does."""
    ranges = [(b, min(n, b + batch_size)) for b in range(0, n, batch_size)]
    if len(ranges) >= 2:
        (b0, e0), (b1, e1) = ranges[-2], ranges[-1]
        lacking = max(0, min_batch - (e1 - b1))
        if lacking and e0 - b0 >= lacking + min_batch:
            ranges[-2], ranges[-1] = (b0, e0 - lacking), (b1 - lacking, e1)
    return ranges


def batches(examples: Sequence[tpb.TrainingExample], batch_size: int, epochs: int,
            shuffle: bool, seed: int, min_batch: int = 1) -> List[tpb.TrainingBatch]:
    if batch_size < 1 or epochs < 1:
        raise ValueError(f"batch_size {batch_size} and epochs {epochs} must be >= 1")
    ranges = epoch_batches(len(examples), batch_size, min_batch)
    if len(ranges) >= 2 and ranges[-1][1] - ranges[-1][0] < min_batch:
        raise ValueError(
            f"with {len(examples)} pairs in batches of {batch_size} each epoch would end with a "
            f"batch of 1 pair, which the contrastive objective cannot learn from; use "
            f"batch_size=3 or more")
    out = []
    for epoch in range(epochs):
        order = epoch_order(len(examples), seed, epoch) if shuffle else list(range(len(examples)))
        for begin, end in ranges:
            out.append(tpb.TrainingBatch(examples=[examples[i] for i in order[begin:end]]))
    return out


def config(objective_value: "tpb.Objective", *, learning_rate: float, num_labels: int,
           label_names: Optional[Sequence[str]], parameters_value: "tpb.ParameterSelection",
           seed: int, warmup_steps: int, total_steps: int, disable_dropout: bool,
           base_version: str, max_length: int, precision: str = "float32",
           eval_data: Optional[EvaluationData] = None, eval_every: int = 0,
           promote_if: str = "", model: str = "") -> tpb.FineTuneConfig:
    """The job's FineTuneConfig, for the FineTune stream and CreateJob alike."""
    from attnserve.v1 import encoder_pb2 as pb

    job_config = tpb.FineTuneConfig(
        objective=objective_value, learning_rate=learning_rate, num_labels=num_labels,
        label_names=list(label_names or []), parameters=parameters_value, seed=seed,
        warmup_steps=warmup_steps, total_steps=total_steps, disable_dropout=disable_dropout,
        base_version=base_version, tokenization=pb.TokenizationOptions(max_length=max_length),
        precision=precision, model=model)
    if eval_data is not None:
        job_config.evaluation.CopyFrom(evaluation_set(eval_data))
        job_config.eval_every = eval_every
        job_config.promote_if = promote_if
    elif promote_if:
        raise ValueError("promote_if needs eval_data: the gate is checked on its scores")
    return job_config


def stream(method: Callable[..., Any], metadata: List[Tuple[str, str]],
           job_config: tpb.FineTuneConfig, todo: List[tpb.TrainingBatch],
           last: tpb.FineTuneRequest, progress: bool,
           batches_in_flight: int) -> FineTuneResult:
    """Runs one FineTune stream: the config, the batches (at most batches_in_flight ahead of the
    server's answers), then `last` (commit or abort). Raises grpc.RpcError as the call fails."""
    from tqdm.auto import tqdm

    requests: "queue.Queue[Optional[tpb.FineTuneRequest]]" = queue.Queue()

    def request_stream() -> Iterable[tpb.FineTuneRequest]:
        while True:
            request = requests.get()
            if request is None:
                return
            yield request

    job_id = base = committed = promotion = ""
    promoted = False
    evaluations: List[Evaluation] = []
    losses: List[float] = []
    warnings: List[str] = []
    sent = 0
    ended = False  # commit/abort sent and the request stream closed

    def finish(request: tpb.FineTuneRequest) -> None:
        nonlocal ended
        if not ended:
            ended = True
            requests.put(request)
            requests.put(None)

    def send_more() -> None:
        nonlocal sent
        while sent < len(todo) and sent - len(losses) < batches_in_flight:
            requests.put(tpb.FineTuneRequest(batch=todo[sent]))
            sent += 1
        if sent == len(todo) and len(losses) == sent:
            finish(last)

    requests.put(tpb.FineTuneRequest(config=job_config))
    bar = tqdm(total=len(todo), disable=not progress, unit="step", desc="finetune")
    call = method(request_stream(), metadata=metadata)
    try:
        send_more()
        for message in call:
            job_id = message.job_id or job_id
            base = message.base_version or base
            committed = message.committed_version or committed
            warnings.extend(message.warnings)
            evaluations.extend(from_proto(e) for e in message.evaluations)
            promoted = promoted or message.promoted
            promotion = message.promotion or promotion
            if message.step > len(losses):
                losses.append(message.loss)
                bar.set_postfix(loss=f"{message.loss:.4f}", refresh=False)
                bar.update(1)
            send_more()
    except grpc.RpcError:
        raise
    except BaseException:
        # Ctrl-C or a bug on our side: abort the job so nothing is published, then wait for the
        # server to confirm.
        finish(tpb.FineTuneRequest(abort=True))
        try:
            for _ in call:
                pass
        except grpc.RpcError:
            pass
        raise
    finally:
        requests.put(None)
        bar.close()
    if last.HasField("commit") and not committed:
        raise error(grpc.StatusCode.UNKNOWN, f"job {job_id} ended after {len(losses)} steps "
                    "without a committed version")
    return FineTuneResult(job_id=job_id, base_version=base, committed_version=committed,
                          steps=len(losses), losses=losses, warnings=warnings,
                          evaluations=evaluations, promoted=promoted, promotion=promotion)
