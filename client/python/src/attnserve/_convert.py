"""Requests from Python values and numpy arrays, and results from responses (the Encoder side)."""
from __future__ import annotations

import dataclasses
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import numpy as np

from attnserve.errors import quote
from attnserve.v1 import encoder_pb2 as pb


@dataclasses.dataclass(frozen=True)
class TokenIds:
    """A pre-tokenized input, used as given (no [CLS]/[SEP] added): this model's vocabulary ids,
    and optionally one segment id per token (default all 0). A 1-D integer numpy array passed
    where a text goes means the same."""

    ids: Sequence[int]
    type_ids: Sequence[int] = ()


# A text, a (first, second) pair encoded together as [CLS] first [SEP] second [SEP], or token ids.
TextInput = Union[str, Tuple[str, str], TokenIds, np.ndarray]
Texts = Union[TextInput, Iterable[TextInput]]

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
_DTYPES = {"float32": pb.FLOAT32, "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16}
_LONG_TEXT = {"chunk": pb.LONG_TEXT_CHUNK}
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
    # The same span as UTF-8 byte offsets.
    byte_start: int = 0
    byte_end: int = 0
    # Which text of the input it came from: 0 = first/only, 1 = second, -1 = special.
    source: int = 0


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
class SparseVector:
    """A BM42 sparse vector: `indices` (uint32, ascending) and their `values` (float32)."""

    indices: np.ndarray
    values: np.ndarray

    def as_dict(self) -> Dict[str, List[Any]]:
        """{"indices": [...], "values": [...]}: the shape Qdrant's clients take."""
        return {"indices": self.indices.tolist(), "values": self.values.tolist()}


@dataclasses.dataclass(frozen=True)
class Timing:
    """Server-side timings of one call, in milliseconds (ResponseMetadata)."""

    token_count: int
    tokenization_ms: float
    queue_ms: float
    inference_ms: float
    total_ms: float
    # Inputs in the engine batch that carried the call (more when the server merged calls).
    batch_inputs: int


@dataclasses.dataclass(frozen=True)
class EncodedInput:
    """Everything Encode returned for one input (encode_full)."""

    tokens: List[Token]
    # The pooled embedding, (d,) float32; empty with pooling="none".
    embedding: np.ndarray
    # Whether the input was cut to max_length, and its length in tokens before (with specials).
    truncated: bool
    untruncated_length: int
    sparse: Optional[SparseVector] = None
    token_embeddings: Optional[np.ndarray] = None  # (T, hidden)
    static_embeddings: Optional[np.ndarray] = None  # (T, hidden)
    # (L, T, hidden) for hidden_layers=, with the layer of each row in hidden_layers.
    hidden_states: Optional[np.ndarray] = None
    hidden_layers: List[int] = dataclasses.field(default_factory=list)
    # Windows the input was embedded in: 1 unless long_text="chunk" split it.
    chunks: int = 1

    @property
    def labels(self) -> List[str]:
        return [t.text for t in self.tokens]


@dataclasses.dataclass(frozen=True)
class Encoding:
    """encode_full's result: `embeddings` (n, d) and per input an EncodedInput."""

    embeddings: np.ndarray
    inputs: List[EncodedInput]
    # The version that computed the (first) call; pin model_version= to fix it across calls.
    model_version: str
    # One per call the client made (long lists are split by the server's per-request limit).
    timings: List[Timing]

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> EncodedInput:
        return self.inputs[index]

    def __iter__(self) -> Iterator[EncodedInput]:
        return iter(self.inputs)


@dataclasses.dataclass(frozen=True)
class Attention:
    """Attention of one text: weights[l, h, i, j] = how much token i attends to token j."""

    tokens: List[Token]
    # The encoder layers and heads along the first two axes of `weights`.
    layers: List[int]
    heads: List[int]
    # (L, H, T, T) post-softmax weights; rows sum to 1. None with weights=False or top_k > 0.
    weights: Optional[np.ndarray]
    # (L, H, T, T) pre-softmax scores QK^T/sqrt(d), when asked for (scores=True).
    scores: Optional[np.ndarray] = None
    # qkv=True: (L, H, T, head_dim) each.
    query: Optional[np.ndarray] = None
    key: Optional[np.ndarray] = None
    value: Optional[np.ndarray] = None
    # mean=True: (L, T, T) mean of the weights over all heads of each layer.
    mean_weights: Optional[np.ndarray] = None
    # rollout=True: (T, T) attention rollout through all layers.
    rollout: Optional[np.ndarray] = None
    # top_k > 0: (L, H, T, k) largest weights of each row, and their columns.
    top_k_weights: Optional[np.ndarray] = None
    top_k_indices: Optional[np.ndarray] = None
    truncated: bool = False
    untruncated_length: int = 0
    model_version: str = ""

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


def _is_pair(value: Any) -> bool:
    return (isinstance(value, (tuple, list)) and len(value) == 2 and
            all(isinstance(v, str) for v in value))


def _token_ids(ids: Any, type_ids: Any = ()) -> pb.Input:
    array = np.asarray(ids)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"token ids are a 1-D sequence of integers, not an array of shape "
                        f"{array.shape} and dtype {array.dtype}")
    return pb.Input(tokens=pb.TokenIds(ids=array.tolist(),
                                       type_ids=np.asarray(type_ids, dtype=np.int64).tolist()))


def make_input(value: TextInput) -> pb.Input:
    if isinstance(value, str):
        return pb.Input(text=value)
    if isinstance(value, np.str_):
        return pb.Input(text=str(value))
    if _is_pair(value):
        return pb.Input(pair=pb.TextPair(first=value[0], second=value[1]))
    if isinstance(value, TokenIds):
        return _token_ids(value.ids, value.type_ids)
    if isinstance(value, np.ndarray):
        return _token_ids(value)
    raise TypeError(f"an input is a str, a (first, second) pair of str, TokenIds or a 1-D "
                    f"integer numpy array of token ids, not {type(value).__name__}")


def make_inputs(texts: Texts) -> List[pb.Input]:
    """One input (str, pair, TokenIds, 1-D id array) or a sequence of them; a numpy array of
    strings gives one text per element, a 2-D integer array one token-id input per row."""
    if isinstance(texts, np.ndarray):
        if texts.dtype.kind in "UO":
            return [make_input(t) for t in texts.reshape(-1)]
        if texts.ndim == 2:
            return [_token_ids(row) for row in texts]
        return [make_input(texts)]
    # A top-level list of two texts is two inputs; only a tuple of two is one pair.
    if isinstance(texts, (str, TokenIds)) or (isinstance(texts, tuple) and _is_pair(texts)):
        return [make_input(texts)]  # type: ignore[arg-type]
    if not isinstance(texts, Iterable):
        return [make_input(texts)]  # raises the TypeError that says what an input is
    return [make_input(t) for t in texts]


def tokenization(max_length: int, truncation: Optional[str]) -> pb.TokenizationOptions:
    options = pb.TokenizationOptions(max_length=max_length)
    if truncation is not None:
        options.truncation = lookup(_TRUNCATION, truncation, "truncation")
    return options


def long_text(name: str) -> "pb.LongText":
    return lookup(_LONG_TEXT, name, "long_text")


def pooling(name: str) -> "pb.Pooling":
    return lookup(_POOLING, name, "pooling")


def dtype(name: str) -> "pb.DType":
    return lookup(_DTYPES, name, "dtype")


def rerank_method(name: str) -> "pb.RerankMethod":
    return lookup(RERANK_METHODS, name, "method")


def rerank_method_name(value: int) -> str:
    return _RERANK_METHOD_NAMES.get(value, str(value))


def lookup(table: Mapping[str, _Value], name: str, what: str) -> _Value:
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(f"{what} {quote(name)}: expected one of {', '.join(table)}") from None


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


def optional_tensor(message: Any, field: str) -> Optional[np.ndarray]:
    return tensor(getattr(message, field)) if message.HasField(field) else None


def tokens(messages: Iterable[pb.Token]) -> List[Token]:
    return [Token(id=t.id, text=t.text, char_start=t.char_start, char_end=t.char_end,
                  type_id=t.type_id, special=t.special, byte_start=t.byte_start,
                  byte_end=t.byte_end, source=t.source) for t in messages]


def timing(metadata: pb.ResponseMetadata) -> Timing:
    return Timing(token_count=metadata.token_count, tokenization_ms=metadata.tokenization_ms,
                  queue_ms=metadata.queue_ms, inference_ms=metadata.inference_ms,
                  total_ms=metadata.total_ms, batch_inputs=metadata.batch_inputs)


def embeddings(results: Iterable[pb.EncodeResult]) -> np.ndarray:
    rows = [np.asarray(r.embedding, dtype=np.float32) for r in results]
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack(rows)


def sparse_vector(message: pb.SparseVector) -> SparseVector:
    return SparseVector(indices=np.asarray(message.indices, dtype=np.uint32),
                        values=np.asarray(message.values, dtype=np.float32))


def encoded_input(result: pb.EncodeResult, sparse: bool) -> EncodedInput:
    hidden = [h for h in result.hidden_states]
    return EncodedInput(
        tokens=tokens(result.tokens), embedding=np.asarray(result.embedding, dtype=np.float32),
        truncated=result.truncated, untruncated_length=result.untruncated_length,
        chunks=result.chunks or 1,
        sparse=sparse_vector(result.sparse) if sparse else None,
        token_embeddings=optional_tensor(result, "token_embeddings"),
        static_embeddings=optional_tensor(result, "static_embeddings"),
        hidden_states=np.stack([tensor(h.tensor) for h in hidden]) if hidden else None,
        hidden_layers=[h.layer for h in hidden])


def _stack(layers: Sequence[pb.LayerAttention], field: str) -> Optional[np.ndarray]:
    if not layers or not layers[0].HasField(field):
        return None
    return np.stack([tensor(getattr(layer, field)) for layer in layers])


def attention(response: pb.AttentionMapResponse) -> Attention:
    result = response.results[0]
    layers = list(result.layers)
    top_weights = top_indices = None
    if layers and layers[0].HasField("weights_top_k"):
        top_weights = np.stack([tensor(layer.weights_top_k.values) for layer in layers])
        top_indices = np.stack([
            np.asarray(layer.weights_top_k.indices, dtype=np.int32).reshape(
                tensor(layer.weights_top_k.values).shape) for layer in layers])
    return Attention(
        tokens=tokens(result.tokens), layers=[layer.layer for layer in layers],
        heads=list(layers[0].heads) if layers else [], weights=_stack(layers, "weights"),
        scores=_stack(layers, "scores"), query=_stack(layers, "query"),
        key=_stack(layers, "key"), value=_stack(layers, "value"),
        mean_weights=_stack(layers, "mean_weights"),
        rollout=optional_tensor(result, "rollout"), top_k_weights=top_weights,
        top_k_indices=top_indices, truncated=result.truncated,
        untruncated_length=result.untruncated_length, model_version=response.model_version)


def label_scores(result: pb.ClassifyResult) -> List[LabelScore]:
    return [LabelScore(label=s.label, name=s.name, probability=s.probability, logit=s.logit)
            for s in result.labels]


def ranking(response: pb.RerankResponse) -> Ranking:
    return Ranking(hits=[RerankHit(index=r.index, score=r.score, document=r.document)
                         for r in response.results],
                   method=rerank_method_name(response.method),
                   model_version=response.model_version)
