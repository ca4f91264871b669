"""The Encoder service's calls (Client's first half): embeddings, attention, tokens, explain,
classify, rerank, models. Each takes `model=` (a served model by name; None = the Client's
`model`, "" = the server's default) and `model_version=` (pin a version; "" = the served one)."""
from __future__ import annotations

import warnings
from typing import Any, List, Optional, Sequence, Union

import grpc
import numpy as np

from attnserve import _convert, _explain, _versions
from attnserve._base import Connection
from attnserve._convert import (Attention, Encoding, LabelScore, Ranking, SparseVector, Texts,
                                TextInput, Token, TokenStates)
from attnserve._explain import Explanation
from attnserve._jobs import varint
from attnserve._versions import ModelInfo
from attnserve.v1 import encoder_pb2 as pb

_HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _health_request(service: str) -> bytes:
    # HealthCheckRequest: field 1 (service), length-delimited; nothing for "".
    data = service.encode()
    return b"\x0a" + varint(len(data)) + data if data else b""


def _health_status(data: bytes) -> int:
    # HealthCheckResponse: field 1 (status) as a varint, the only field.
    if len(data) >= 2 and data[0] == 0x08:
        return data[1]
    return 0


class TruncationWarning(UserWarning):
    """encode() embedded only the first max_length tokens of an input (truncation not chosen)."""


def _warn_truncated(results: Sequence[pb.EncodeResult]) -> None:
    cut = [(i, r.untruncated_length, len(r.tokens)) for i, r in enumerate(results) if r.truncated]
    if not cut:
        return
    i, length, kept = cut[0]
    more = f" (and {len(cut) - 1} more inputs)" if len(cut) > 1 else ""
    warnings.warn(
        f"inputs[{i}] has {length} tokens{more}, more than max_length {kept}: its embedding is "
        f"of the first {kept} tokens only. Pass truncation=\"right\" to accept that without this "
        "warning, \"left\" to keep the end, \"none\" to refuse such inputs; encode_full() "
        "reports truncation per input", TruncationWarning, stacklevel=3)


class EncoderCalls(Connection):
    def _batch_size(self, n: int) -> int:
        """Inputs per request: the server's --max-inputs-per-request (asked once)."""
        if n <= 1:
            return 1
        if self._max_inputs is None:
            self._max_inputs = max(1, self.model_info().max_inputs_per_request or n)
        return self._max_inputs

    def _encode_responses(self, texts: Texts, **fields: Any) -> List[pb.EncodeResponse]:
        inputs = _convert.make_inputs(texts)
        return [self._call(self._encoder.Encode, pb.EncodeRequest(inputs=part, **fields))
                for part in _convert.chunks(inputs, self._batch_size(len(inputs)))]

    def _encode_calls(self, texts: Texts, **fields: Any) -> List[pb.EncodeResult]:
        return [r for response in self._encode_responses(texts, **fields)
                for r in response.results]

    @staticmethod
    def _long_text(long_text: Optional[str], chunk_overlap: Optional[int]) -> dict:
        fields: dict = {}
        if long_text is not None:
            fields["long_text"] = _convert.long_text(long_text)
        if chunk_overlap is not None:
            fields["chunk_overlap"] = chunk_overlap
        return fields

    @staticmethod
    def _pooled(pooling: str, normalize: Optional[bool], dimensions: Optional[int]) -> dict:
        fields: dict = dict(pooling=_convert.pooling(pooling))
        if normalize is not None:
            fields["normalize"] = normalize
        if dimensions is not None:
            fields["dimensions"] = dimensions
        return fields

    # --- models --------------------------------------------------------------------------------
    def model_info(self, model_version: str = "", *, model: Optional[str] = None) -> ModelInfo:
        """The model's architecture, sizes, defaults and versions (GetModelInfo)."""
        return _versions.model_info(self._call(
            self._encoder.GetModelInfo,
            pb.GetModelInfoRequest(model_version=model_version, model=self._model(model))))

    def models(self) -> List[ModelInfo]:
        """Every served model, the default first (ListModels); `.name` is what model= takes."""
        response = self._call(self._encoder.ListModels, pb.ListModelsRequest())
        return [_versions.model_info(m) for m in response.models]

    def health(self, service: str = "") -> str:
        """The grpc.health.v1 status: "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN"
        (service "" = the server, or "attnserve.v1.Encoder")."""
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check",
                                          request_serializer=_health_request,
                                          response_deserializer=_health_status)
        try:
            status = check(service, timeout=self.timeout, metadata=self._metadata)
            return _HEALTH.get(status, "UNKNOWN")
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            raise self._error(e, trainer=False) from None

    # --- embeddings ----------------------------------------------------------------------------
    def encode(self, texts: Texts, *, pooling: str = "default", normalize: Optional[bool] = None,
               dimensions: Optional[int] = None, max_length: int = 0,
               truncation: Optional[str] = None, model_version: str = "",
               model: Optional[str] = None, long_text: Optional[str] = None,
               chunk_overlap: Optional[int] = None) -> np.ndarray:
        """Pooled sentence embeddings, float32 (n, d): one row per input.

        texts: a str, a (first, second) pair, TokenIds or a 1-D integer array of token ids, or a
        list (or numpy array) of them. pooling: "default" (the model's), "cls", "mean", "max",
        "cls_attention"; normalize: L2-normalise (None = the model's default); dimensions:
        Matryoshka truncation to the first `dimensions` values (re-normalised); truncation:
        "right" (default), "left", "none" (too-long inputs are an error). Lists longer than
        the server's per-request limit are sent in several calls. An input longer than
        max_length (0 = the model's default) is cut to it: with truncation unset, a
        TruncationWarning says which. long_text="chunk" embeds all of a long text instead: in
        windows of max_length tokens that share chunk_overlap tokens (None = the server's
        default, max_length // 8), pooled each, averaged weighted by window length (README "Long
        documents"). encode_full() returns the tokens, truncation, windows and the other outputs.
        """
        fields = self._pooled(pooling, normalize, dimensions)
        results = self._encode_calls(
            texts, tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model), **fields,
            **self._long_text(long_text, chunk_overlap))
        if truncation is None:
            _warn_truncated(results)
        return _convert.embeddings(results)

    def encode_full(self, texts: Texts, *, pooling: str = "default",
                    normalize: Optional[bool] = None, dimensions: Optional[int] = None,
                    sparse: bool = False, token_embeddings: bool = False,
                    static_embeddings: bool = False, hidden_layers: Sequence[int] = (),
                    dtype: str = "float32", max_length: int = 0,
                    truncation: Optional[str] = None, model_version: str = "",
                    model: Optional[str] = None, long_text: Optional[str] = None,
                    chunk_overlap: Optional[int] = None) -> Encoding:
        """Every Encode output in one call: Encoding(embeddings (n, d), inputs, model_version,
        timings), inputs[i] with its tokens, whether it was truncated and its untruncated
        length, and as asked: its BM42 sparse vector, the last layer's token embeddings
        (T, hidden), the static embeddings, hidden states of `hidden_layers` (L, T, hidden).

        dtype: how tensors travel ("float32", "float16", "bfloat16"); they arrive as float32.
        Other options as encode().
        """
        responses = self._encode_responses(
            texts, tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model), sparse=sparse,
            return_token_embeddings=token_embeddings,
            return_static_embeddings=static_embeddings, hidden_layers=list(hidden_layers),
            output_dtype=_convert.dtype(dtype), **self._pooled(pooling, normalize, dimensions),
            **self._long_text(long_text, chunk_overlap))
        results = [r for response in responses for r in response.results]
        return Encoding(embeddings=_convert.embeddings(results),
                        inputs=[_convert.encoded_input(r, sparse) for r in results],
                        model_version=responses[0].model_version if responses else "",
                        timings=[_convert.timing(r.metadata) for r in responses])

    def sparse(self, texts: Texts, *, max_length: int = 0, truncation: Optional[str] = None,
               model_version: str = "", model: Optional[str] = None) -> List[SparseVector]:
        """BM42 sparse vectors, one per input (fastembed's Qdrant/bm42-all-minilm-l6-v2-attentions
        recipe): `.indices` uint32 ascending, `.values` float32; `.as_dict()` for Qdrant."""
        results = self._encode_calls(
            texts, pooling=pb.POOLING_NONE, sparse=True,
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model))
        return [_convert.sparse_vector(r.sparse) for r in results]

    def token_embeddings(self, texts: Texts, *, max_length: int = 0,
                         truncation: Optional[str] = None, model_version: str = "",
                         model: Optional[str] = None) -> List[TokenStates]:
        """Per input: its tokens and the last layer's contextual embeddings, (T, hidden)."""
        results = self._encode_calls(
            texts, pooling=pb.POOLING_NONE, return_token_embeddings=True,
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model))
        return [TokenStates(tokens=_convert.tokens(r.tokens),
                            values=_convert.tensor(r.token_embeddings)) for r in results]

    def static_embeddings(self, texts: Texts, *, max_length: int = 0,
                          truncation: Optional[str] = None, model_version: str = "",
                          model: Optional[str] = None) -> List[TokenStates]:
        """Per input: word + position + segment embeddings before any attention, (T, hidden)."""
        results = self._encode_calls(
            texts, pooling=pb.POOLING_NONE, return_static_embeddings=True,
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model))
        return [TokenStates(tokens=_convert.tokens(r.tokens),
                            values=_convert.tensor(r.static_embeddings)) for r in results]

    def hidden_states(self, texts: Texts, layers: Sequence[int], *, max_length: int = 0,
                      truncation: Optional[str] = None, model_version: str = "",
                      model: Optional[str] = None) -> List[TokenStates]:
        """Per input: hidden states of `layers` stacked as (L, T, hidden).

        Layer 0 is the embedding output, i the output of encoder layer i, -1 the last.
        """
        results = self._encode_calls(
            texts, pooling=pb.POOLING_NONE, hidden_layers=list(layers),
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model))
        return [TokenStates(tokens=_convert.tokens(r.tokens),
                            values=np.stack([_convert.tensor(h.tensor) for h in r.hidden_states]),
                            layers=[h.layer for h in r.hidden_states]) for r in results]

    # --- attention and tokens ------------------------------------------------------------------
    def attention(self, text: TextInput, layers: Optional[Sequence[int]] = None,
                  heads: Optional[Sequence[int]] = None, *, scores: bool = False,
                  weights: bool = True, qkv: bool = False, mean: bool = False,
                  rollout: bool = False, top_k: int = 0, dtype: str = "float32",
                  max_length: int = 0, truncation: Optional[str] = None,
                  model_version: str = "", model: Optional[str] = None) -> Attention:
        """Attention of one text (or pair) as (L, H, T, T) arrays, with the tokens as labels.

        layers: 0-based encoder layers (negative from the end), None = all; heads: None = all.
        scores=True adds the pre-softmax scores, qkv=True the per-head query/key/value vectors,
        mean=True the mean over heads per layer, rollout=True the attention rollout (T, T);
        top_k > 0 returns each row's k largest weights and their columns instead of `weights`.
        """
        request = pb.AttentionMapRequest(
            inputs=[_convert.make_input(text)], layers=list(layers or []),
            heads=list(heads or []), include_weights=weights, include_scores=scores,
            include_qkv=qkv, mean_over_heads=mean, rollout=rollout, top_k=top_k,
            output_dtype=_convert.dtype(dtype),
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model))
        return _convert.attention(self._call(self._encoder.AttentionMap, request))

    def tokenize(self, texts: Texts, *, max_length: int = 0, truncation: Optional[str] = None,
                 model_version: str = "", model: Optional[str] = None) -> List[List[Token]]:
        """The tokens of each input, exactly as Encode sees them."""
        inputs = _convert.make_inputs(texts)
        out: List[List[Token]] = []
        for part in _convert.chunks(inputs, self._batch_size(len(inputs))):
            request = pb.TokenizeRequest(
                inputs=part, tokenization=_convert.tokenization(max_length, truncation),
                model_version=model_version, model=self._model(model))
            response = self._call(self._encoder.Tokenize, request)
            out.extend(_convert.tokens(r.tokens) for r in response.results)
        return out

    # --- explain, classify, rerank -------------------------------------------------------------
    def explain(self, query: str, documents: Union[str, Sequence[str]], *,
                method: str = "pairwise", steps: Optional[int] = None, layer: int = 0,
                baseline: str = "pad", word_level: bool = False, model_version: str = "",
                model: Optional[str] = None) -> List[Explanation]:
        """Why the query and each document are similar: one Explanation per document.

        method: "pairwise" (token-pair matrix by integrated Jacobians; texts up to 128 tokens),
        "integrated_gradients" ("ig") or "gradient_x_input" ("gxi") per token; steps: points of
        the integrated path (None = 32); layer: attribute at the hidden states entering this
        encoder layer (0 = the embedding output); baseline: "pad", "mask" or "zero";
        word_level=True also sums word pieces into words. Pairwise takes seconds per document.
        """
        if isinstance(documents, str):
            documents = [documents]
        request = pb.ExplainRequest(
            query=query, documents=list(documents),
            method=_convert.lookup(_explain.METHODS, method, "method"), layer=layer,
            baseline=_convert.lookup(_explain.BASELINES, baseline, "baseline"),
            word_level=word_level, model_version=model_version, model=self._model(model))
        if steps is not None:
            request.steps = steps
        response = self._call(self._encoder.Explain, request)
        return [_explain.explanation(r) for r in response.results]

    def classify(self, texts: Texts, *, top_k: int = 0, max_length: int = 0,
                 truncation: Optional[str] = None, model_version: str = "",
                 model: Optional[str] = None) -> List[List[LabelScore]]:
        """Per input, the labels of the version's classification head, most probable first.

        Texts for a head trained with "classification", (first, second) pairs for
        "pair_classification". A version without a head raises FailedPrecondition.
        """
        inputs = _convert.make_inputs(texts)
        out: List[List[LabelScore]] = []
        for part in _convert.chunks(inputs, self._batch_size(len(inputs))):
            request = pb.ClassifyRequest(
                inputs=part, top_k=top_k, model_version=model_version, model=self._model(model),
                tokenization=_convert.tokenization(max_length, truncation))
            response = self._call(self._encoder.Classify, request)
            out.extend(_convert.label_scores(r) for r in response.results)
        return out

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int = 0,
               method: str = "auto", return_documents: bool = False, max_length: int = 0,
               truncation: Optional[str] = None, model_version: str = "",
               model: Optional[str] = None) -> Ranking:
        """Documents scored against the query, best first.

        method: "auto" (cross-encoder when the version has a pair_classification head, else
        cosine), "cosine" or "cross_encoder". top_n: keep the best n (0 = all).
        """
        request = pb.RerankRequest(
            query=query, documents=list(documents), top_n=top_n,
            method=_convert.rerank_method(method), return_documents=return_documents,
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version, model=self._model(model))
        return _convert.ranking(self._call(self._encoder.Rerank, request))
