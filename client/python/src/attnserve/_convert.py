"""Requests from Python values and numpy arrays from responses, shared by Client and AsyncClient."""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from attnserve.v1 import encoder_pb2 as pb

# A text, or a (first, second) pair encoded together as [CLS] first [SEP] second [SEP].
TextInput = Union[str, Tuple[str, str]]

_POOLING = {
    "default": pb.POOLING_MODEL_DEFAULT,
    "cls": pb.POOLING_CLS,
    "mean": pb.POOLING_MEAN,
    "max": pb.POOLING_MAX,
    "none": pb.POOLING_NONE,
    "cls_attention": pb.POOLING_CLS_ATTENTION,
}
_TRUNCATION = {
    "right": pb.TRUNCATION_RIGHT,
    "left": pb.TRUNCATION_LEFT,
    "none": pb.TRUNCATION_NONE,
}
RERANK_METHODS = {
    "auto": pb.RERANK_METHOD_UNSPECIFIED,
    "cosine": pb.RERANK_COSINE,
    "cross_encoder": pb.RERANK_CROSS_ENCODER,
}
_RERANK_METHOD_NAMES: Dict[int, str] = {value: name for name, value in RERANK_METHODS.items()}
_Value = TypeVar("_Value")


@dataclasses.dataclass(frozen=True)
class Token:
    """One token as the server's tokenizer made it."""

    id: int
    text: str
    # [char_start, char_end): Python str indices into the input text; (0, 0) for specials.
    char_start: int
    char_end: int
    # 0 for the first text, 1 for the second of a pair.
    type_id: int
    # True for [CLS] / [SEP].
    special: bool


@dataclasses.dataclass(frozen=True)
class TokenStates:
    """Per-token vectors of one input: `values` is (T, hidden) or, for hidden_states, (L, T, hidden)."""

    tokens: List[Token]
    values: np.ndarray
    # hidden_states only: the layer of values[i] (0 = embedding output, i = encoder layer i).
    layers: List[int] = dataclasses.field(default_factory=list)

    @property
    def labels(self) -> List[str]:
        return [t.text for t in self.tokens]


@dataclasses.dataclass(frozen=True)
class Attention:
    """Attention of one text: weights[l, h, i, j] = how much token i attends to token j."""

    tokens: List[Token]
    # The encoder layers and heads along the first two axes of `weights`.
    layers: List[int]
    heads: List[int]
    # (L, H, T, T) post-softmax weights; rows sum to 1.
    weights: np.ndarray
    # (L, H, T, T) pre-softmax scores QK^T/sqrt(d), when asked for (scores=True).
    scores: Optional[np.ndarray] = None

    @property
    def labels(self) -> List[str]:
        """Row and column labels of every map."""
        return [t.text for t in self.tokens]


@dataclasses.dataclass(frozen=True)
class LabelScore:
    label: int
    # The job's label name, "" when it gave none.
    name: str
    probability: float
    logit: float


@dataclasses.dataclass(frozen=True)
class RerankHit:
    # Index into the documents given to rerank().
    index: int
    score: float
    # The document's text when rerank(..., return_documents=True).
    document: str = ""


@dataclasses.dataclass(frozen=True)
class Ranking:
    """Documents best first, and how they were scored: "cosine" or "cross_encoder"."""

    hits: List[RerankHit]
    method: str
    model_version: str


def make_input(value: TextInput) -> pb.Input:
    if isinstance(value, str):
        return pb.Input(text=value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, str) for v in value):
        return pb.Input(pair=pb.TextPair(first=value[0], second=value[1]))
    raise TypeError(
        f"an input is a str or a (first, second) pair of str, not {type(value).__name__}")


def make_inputs(texts: Union[TextInput, Iterable[TextInput]]) -> List[pb.Input]:
    """One str (or pair) or a sequence of them."""
    if isinstance(texts, str) or (isinstance(texts, tuple) and len(texts) == 2 and
                                  all(isinstance(v, str) for v in texts)):
        return [make_input(texts)]  # type: ignore[arg-type]
    return [make_input(t) for t in texts]  # type: ignore[union-attr]


def tokenization(max_length: int, truncation: Optional[str]) -> pb.TokenizationOptions:
    options = pb.TokenizationOptions(max_length=max_length)
    if truncation is not None:
        options.truncation = lookup(_TRUNCATION, truncation, "truncation")
    return options


def pooling(name: str) -> "pb.Pooling":
    return lookup(_POOLING, name, "pooling")


def rerank_method(name: str) -> "pb.RerankMethod":
    return lookup(RERANK_METHODS, name, "method")


def rerank_method_name(value: int) -> str:
    return _RERANK_METHOD_NAMES.get(value, str(value))


def lookup(table: Mapping[str, _Value], name: str, what: str) -> _Value:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"{what} {name!r}: expected one of {', '.join(table)}") from None


def chunks(items: Sequence, size: int) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def tensor(message: pb.Tensor) -> np.ndarray:
    """A Tensor message as a float32 array of its shape (float16/bfloat16 widened)."""
    shape = tuple(int(d) for d in message.shape)
    if message.dtype in (pb.DTYPE_UNSPECIFIED, pb.FLOAT32):
        values = np.frombuffer(message.data, dtype="<f4")
    elif message.dtype == pb.FLOAT16:
        values = np.frombuffer(message.data, dtype="<f2").astype(np.float32)
    elif message.dtype == pb.BFLOAT16:
        values = (np.frombuffer(message.data, dtype="<u2").astype(np.uint32) << 16).view(
            np.float32)
    else:
        raise ValueError(f"tensor dtype {message.dtype} is not one this client knows")
    return values.reshape(shape).astype(np.float32, copy=False)


def tokens(messages: Iterable[pb.Token]) -> List[Token]:
    return [Token(id=t.id, text=t.text, char_start=t.char_start, char_end=t.char_end,
                  type_id=t.type_id, special=t.special) for t in messages]


def embeddings(results: Iterable[pb.EncodeResult]) -> np.ndarray:
    rows = [np.asarray(r.embedding, dtype=np.float32) for r in results]
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack(rows)


def attention(result: pb.AttentionResult, scores: bool) -> Attention:
    layers = [layer.layer for layer in result.layers]
    heads = list(result.layers[0].heads) if result.layers else []
    weights = np.stack([tensor(layer.weights) for layer in result.layers])
    score_maps = np.stack([tensor(layer.scores) for layer in result.layers]) if scores else None
    return Attention(tokens=tokens(result.tokens), layers=layers, heads=heads, weights=weights,
                     scores=score_maps)


def label_scores(result: pb.ClassifyResult) -> List[LabelScore]:
    return [LabelScore(label=s.label, name=s.name, probability=s.probability, logit=s.logit)
            for s in result.labels]


def ranking(response: pb.RerankResponse) -> Ranking:
    return Ranking(hits=[RerankHit(index=r.index, score=r.score, document=r.document)
                         for r in response.results],
                   method=rerank_method_name(response.method),
                   model_version=response.model_version)
