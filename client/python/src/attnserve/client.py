"""attnserve.Client: the Encoder and Trainer services as numpy arrays and plain Python values."""
from __future__ import annotations

import dataclasses
import queue
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from attnserve import _convert, _evaluation, _finetune
from attnserve._convert import Attention, LabelScore, Ranking, TextInput, Token, TokenStates
from attnserve._finetune import FineTuneResult, TrainingData
from attnserve.errors import AttnserveError
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc
from attnserve.v1 import trainer_pb2 as tpb
from attnserve.v1 import trainer_pb2_grpc

# tls: False (plain TCP), True (the system's trusted roots), a CA certificate as PEM bytes or a
# path to a PEM file, or ready-made grpc.ChannelCredentials.
TlsOption = Union[bool, bytes, str, grpc.ChannelCredentials]


@dataclasses.dataclass(frozen=True)
class VersionInfo:
    version: str
    origin: str
    created_utc: str
    serving: bool
    description: str
    notes: List[str]
    # Committed without promotion and never served by default: pin it, or promote() it.
    staged: bool = False


def channel_credentials(tls: TlsOption) -> Optional[grpc.ChannelCredentials]:
    if tls is False or tls is None:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if isinstance(tls, str):
        with open(tls, "rb") as f:
            tls = f.read()
    return grpc.ssl_channel_credentials(root_certificates=tls)


def channel_options(tls_server_name: Optional[str]) -> List[Tuple[str, Any]]:
    # Responses with attention maps or hidden states of long batches are large.
    options: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", 256 << 20),
                                      ("grpc.max_send_message_length", 64 << 20)]
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return options


def versions_of(response: tpb.ListVersionsResponse) -> List[VersionInfo]:
    return [VersionInfo(version=v.version, origin=v.origin, created_utc=v.created_utc,
                        serving=v.serving, description=v.description, notes=list(v.notes),
                        staged=v.staged)
            for v in response.versions]


class Client:
    """A connection to an attnserve server.

    >>> client = attnserve.Client("localhost:50051")
    >>> client.encode(["a sentence", "another"]).shape
    (2, 384)

    `token` is sent as `authorization: Bearer <token>` on every call (the server's
    --api-key-file for Encoder calls); `trainer_token` on Trainer calls (--trainer-token-file),
    defaulting to `token`. Every failed call raises AttnserveError(code, message).
    """

    def __init__(self, address: str, token: Optional[str] = None, tls: TlsOption = False, *,
                 trainer_token: Optional[str] = None, timeout: Optional[float] = 120.0,
                 tls_server_name: Optional[str] = None) -> None:
        credentials = channel_credentials(tls)
        options = channel_options(tls_server_name)
        if credentials is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            self._channel = grpc.secure_channel(address, credentials, options=options)
        self._encoder = encoder_pb2_grpc.EncoderStub(self._channel)
        self._trainer = trainer_pb2_grpc.TrainerStub(self._channel)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        trainer_token = trainer_token if trainer_token is not None else token
        self._trainer_metadata = (
            [("authorization", f"Bearer {trainer_token}")] if trainer_token else [])
        self.timeout = timeout
        self._max_inputs: Optional[int] = None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ------------------------------------------------------------------------------
    def _call(self, method: Callable[..., Any], request: Any, trainer: bool = False) -> Any:
        try:
            return method(request, timeout=self.timeout,
                          metadata=self._trainer_metadata if trainer else self._metadata)
        except grpc.RpcError as e:
            raise AttnserveError.from_rpc_error(e) from None

    def _batch_size(self, n: int) -> int:
        """Inputs per request: the server's --max-inputs-per-request (asked once)."""
        if n <= 1:
            return 1
        if self._max_inputs is None:
            self._max_inputs = max(1, self.model_info().max_inputs_per_request or n)
        return self._max_inputs

    def _encode_calls(self, texts: Union[TextInput, Iterable[TextInput]],
                      **fields: Any) -> List[pb.EncodeResult]:
        inputs = _convert.make_inputs(texts)
        results: List[pb.EncodeResult] = []
        for part in _convert.chunks(inputs, self._batch_size(len(inputs))):
            request = pb.EncodeRequest(inputs=part, **fields)
            results.extend(self._call(self._encoder.Encode, request).results)
        return results

    # --- Encoder -------------------------------------------------------------------------------
    def model_info(self, model_version: str = "") -> pb.ModelInfo:
        return self._call(self._encoder.GetModelInfo,
                          pb.GetModelInfoRequest(model_version=model_version))

    def encode(self, texts: Union[TextInput, Iterable[TextInput]], *, pooling: str = "default",
               normalize: Optional[bool] = None, dimensions: Optional[int] = None,
               max_length: int = 0, truncation: Optional[str] = None,
               model_version: str = "") -> np.ndarray:
        """Pooled sentence embeddings, float32 (n, d): one row per text (or (first, second) pair).

        pooling: "default" (the model's), "cls", "mean", "max", "cls_attention";
        normalize: L2-normalise (None = the model's default); dimensions: Matryoshka truncation
        to the first `dimensions` values (re-normalised); truncation: "right" (default), "left",
        "none" (too-long inputs are an error). Lists longer than the server's per-request limit
        are sent in several calls.
        """
        fields: dict = dict(pooling=_convert.pooling(pooling),
                            tokenization=_convert.tokenization(max_length, truncation),
                            model_version=model_version)
        if normalize is not None:
            fields["normalize"] = normalize
        if dimensions is not None:
            fields["dimensions"] = dimensions
        return _convert.embeddings(self._encode_calls(texts, **fields))

    def token_embeddings(self, texts: Union[TextInput, Iterable[TextInput]], *,
                         max_length: int = 0, truncation: Optional[str] = None,
                         model_version: str = "") -> List[TokenStates]:
        """Per input: its tokens and the last layer's contextual embeddings, (T, hidden)."""
        results = self._encode_calls(
            texts, pooling=pb.POOLING_NONE, return_token_embeddings=True,
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version)
        return [TokenStates(tokens=_convert.tokens(r.tokens),
                            values=_convert.tensor(r.token_embeddings)) for r in results]

    def static_embeddings(self, texts: Union[TextInput, Iterable[TextInput]], *,
                          max_length: int = 0, model_version: str = "") -> List[TokenStates]:
        """Per input: word + position + segment embeddings before any attention, (T, hidden)."""
        results = self._encode_calls(
            texts, pooling=pb.POOLING_NONE, return_static_embeddings=True,
            tokenization=_convert.tokenization(max_length, None), model_version=model_version)
        return [TokenStates(tokens=_convert.tokens(r.tokens),
                            values=_convert.tensor(r.static_embeddings)) for r in results]

    def hidden_states(self, texts: Union[TextInput, Iterable[TextInput]],
                      layers: Sequence[int], *, max_length: int = 0,
                      truncation: Optional[str] = None,
                      model_version: str = "") -> List[TokenStates]:
        """Per input: hidden states of `layers` stacked as (L, T, hidden).

        Layer 0 is the embedding output, i the output of encoder layer i, -1 the last.
        """
        results = self._encode_calls(
            texts, pooling=pb.POOLING_NONE, hidden_layers=list(layers),
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version)
        return [TokenStates(tokens=_convert.tokens(r.tokens),
                            values=np.stack([_convert.tensor(h.tensor) for h in r.hidden_states]),
                            layers=[h.layer for h in r.hidden_states]) for r in results]

    def attention(self, text: TextInput, layers: Optional[Sequence[int]] = None,
                  heads: Optional[Sequence[int]] = None, *, scores: bool = False,
                  max_length: int = 0, truncation: Optional[str] = None,
                  model_version: str = "") -> Attention:
        """Attention weights of one text (or pair) as (L, H, T, T), with the tokens as labels.

        layers: 0-based encoder layers (negative from the end), None = all; heads: None = all.
        scores=True also returns the pre-softmax scores.
        """
        request = pb.AttentionMapRequest(
            inputs=[_convert.make_input(text)], layers=list(layers or []),
            heads=list(heads or []), include_scores=scores,
            tokenization=_convert.tokenization(max_length, truncation),
            model_version=model_version)
        response = self._call(self._encoder.AttentionMap, request)
        return _convert.attention(response.results[0], scores)

    def tokenize(self, texts: Union[TextInput, Iterable[TextInput]], *, max_length: int = 0,
                 truncation: Optional[str] = None, model_version: str = "") -> List[List[Token]]:
        """The tokens of each input, exactly as Encode sees them."""
        inputs = _convert.make_inputs(texts)
        out: List[List[Token]] = []
        for part in _convert.chunks(inputs, self._batch_size(len(inputs))):
            request = pb.TokenizeRequest(
                inputs=part, tokenization=_convert.tokenization(max_length, truncation),
                model_version=model_version)
            response = self._call(self._encoder.Tokenize, request)
            out.extend(_convert.tokens(r.tokens) for r in response.results)
        return out

    def classify(self, texts: Union[TextInput, Iterable[TextInput]], *, top_k: int = 0,
                 max_length: int = 0, model_version: str = "") -> List[List[LabelScore]]:
        """Per input, the labels of the version's classification head, most probable first.

        Texts for a head trained with "classification", (first, second) pairs for
        "pair_classification". A version without a head raises FAILED_PRECONDITION.
        """
        inputs = _convert.make_inputs(texts)
        out: List[List[LabelScore]] = []
        for part in _convert.chunks(inputs, self._batch_size(len(inputs))):
            request = pb.ClassifyRequest(
                inputs=part, top_k=top_k, model_version=model_version,
                tokenization=_convert.tokenization(max_length, None))
            response = self._call(self._encoder.Classify, request)
            out.extend(_convert.label_scores(r) for r in response.results)
        return out

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int = 0,
               method: str = "auto", return_documents: bool = False, max_length: int = 0,
               model_version: str = "") -> Ranking:
        """Documents scored against the query, best first.

        method: "auto" (cross-encoder when the version has a pair_classification head, else
        cosine), "cosine" or "cross_encoder". top_n: keep the best n (0 = all).
        """
        request = pb.RerankRequest(
            query=query, documents=list(documents), top_n=top_n,
            method=_convert.rerank_method(method), return_documents=return_documents,
            tokenization=_convert.tokenization(max_length, None), model_version=model_version)
        return _convert.ranking(self._call(self._encoder.Rerank, request))

    # --- Trainer -------------------------------------------------------------------------------
    def versions(self) -> List[VersionInfo]:
        """Committed versions, oldest first (VersionInfo.serving marks the default)."""
        return versions_of(self._call(self._trainer.ListVersions, tpb.ListVersionsRequest(),
                                      trainer=True))

    def rollback(self, version: str = "") -> List[VersionInfo]:
        """Serve again the version served before the current one (or `version`, served before)."""
        return versions_of(self._call(self._trainer.Rollback,
                                      tpb.RollbackRequest(version=version), trainer=True))

    def set_serving_version(self, version: str) -> List[VersionInfo]:
        return versions_of(self._call(self._trainer.SetServingVersion,
                                      tpb.SetServingVersionRequest(version=version),
                                      trainer=True))

    def promote(self, version: str) -> List[VersionInfo]:
        """Serve a committed (staged) version by default, recorded in the model store."""
        return versions_of(self._call(self._trainer.Promote, tpb.PromoteRequest(version=version),
                                      trainer=True))

    def evaluate(self, data: _evaluation.EvaluationData, *, version: str = "",
                 max_length: int = 0) -> _evaluation.Evaluation:
        """Scores `version` ("" = the served one) on held-out data without training.

        data: a JSON Lines file or dicts, one example each (the task is told from the first):
        retrieval {"query": ..., "item": ...} ({"item": ...} alone adds a distractor),
        contrastive pairs (each anchor retrieves its positive), {"first", "second", "score"}
        (Spearman), {"text", "label"} or {"first", "second", "label"} (a version with a
        classification head: accuracy, macro-F1). At most 5,000 texts.
        """
        request = tpb.EvaluateRequest(
            version=version, evaluation=_evaluation.evaluation_set(data),
            tokenization=_convert.tokenization(max_length, None))
        return _evaluation.from_proto(self._call(self._trainer.Evaluate, request, trainer=True))

    def training_report(self, version: str) -> _evaluation.TrainingReport:
        """What the job that committed `version` recorded: settings, losses, evaluations, the
        promotion decision, how far each parameter group moved."""
        return _evaluation.report_from_proto(self._call(
            self._trainer.GetTrainingReport, tpb.GetTrainingReportRequest(version=version),
            trainer=True))

    def finetune(self, data: TrainingData, objective: Union[str, int], *, batch_size: int = 16,
                 epochs: int = 1, learning_rate: float = 0.0, num_labels: int = 0,
                 label_names: Optional[Sequence[str]] = None, parameters: Union[str, int] = "all",
                 seed: int = 0, shuffle: bool = True, warmup_steps: int = 0,
                 total_steps: int = 0, disable_dropout: bool = False, base_version: str = "",
                 max_length: int = 0, commit: bool = True, description: str = "",
                 promote: bool = False, serve: Optional[bool] = None, progress: bool = True,
                 batches_in_flight: int = 2,
                 eval_data: Optional[_evaluation.EvaluationData] = None, eval_every: int = 0,
                 promote_if: str = "", precision: str = "float32") -> FineTuneResult:
        """Fine-tunes on `data` and commits a new version (or aborts with commit=False).

        The version is staged (pin it with model_version=..., then promote() it) unless
        promote=True. `serve` is the deprecated name of `promote`.

        data: a JSON Lines file (attnctl's format: {"anchor", "positive"[, "negative"]},
        {"first", "second", "score"}, {"text", "label"}, {"first", "second", "label"}), or an
        iterable of such dicts, of tuples in that field order, or of TrainingExample messages.
        objective: "contrastive", "cosine", "classification", "pair_classification".
        progress=True shows a tqdm bar with the loss. Ctrl-C aborts the job (nothing is
        published) and re-raises KeyboardInterrupt.
        eval_data (see evaluate()) is scored on the base, every eval_every steps and on the
        committed weights (FineTuneResult.evaluations); promote_if ("recall@1>=0.8",
        "mrr@10>base") promotes the version only when it holds (FineTuneResult.promotion says).
        precision "bfloat16" trains with bf16 matmuls (fp32 master weights and AdamW): faster on
        CPUs with avx512_bf16 or AMX, slow where oneDNN emulates bf16 (older AVX-512).
        Batches are the ones attnctl finetune sends for the same data, seed and batch_size.
        """
        from tqdm.auto import tqdm

        if serve is not None:
            promote = serve
        objective_value = _finetune.objective(objective)
        examples = _finetune.load(data, objective_value)
        # A contrastive batch needs 2 pairs: one pair has no in-batch negative.
        todo = _finetune.batches(examples, batch_size, epochs, shuffle, seed,
                                 min_batch=2 if objective_value == tpb.CONTRASTIVE else 1)
        job_config = _finetune.config(
            objective_value, learning_rate=learning_rate, num_labels=num_labels,
            label_names=label_names, parameters_value=_finetune.parameters(parameters),
            seed=seed, warmup_steps=warmup_steps, total_steps=total_steps,
            disable_dropout=disable_dropout, base_version=base_version, max_length=max_length)
        job_config.precision = precision
        if eval_data is not None:
            job_config.evaluation.CopyFrom(_evaluation.evaluation_set(eval_data))
            job_config.eval_every = eval_every
            job_config.promote_if = promote_if
            promote = promote or bool(promote_if)

        requests: "queue.Queue[Optional[tpb.FineTuneRequest]]" = queue.Queue()

        def request_stream() -> Iterable[tpb.FineTuneRequest]:
            while True:
                request = requests.get()
                if request is None:
                    return
                yield request

        job_id = base = committed = promotion = ""
        promoted = False
        evaluations: List[_evaluation.Evaluation] = []
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
                finish(tpb.FineTuneRequest(commit=tpb.CommitRequest(
                    description=description, promote=promote)) if commit
                    else tpb.FineTuneRequest(abort=True))

        requests.put(tpb.FineTuneRequest(config=job_config))
        bar = tqdm(total=len(todo), disable=not progress, unit="step", desc="finetune")
        call = self._trainer.FineTune(request_stream(), metadata=self._trainer_metadata)
        try:
            send_more()
            for message in call:
                job_id = message.job_id or job_id
                base = message.base_version or base
                committed = message.committed_version or committed
                warnings.extend(message.warnings)
                evaluations.extend(_evaluation.from_proto(e) for e in message.evaluations)
                promoted = promoted or message.promoted
                promotion = message.promotion or promotion
                if message.step > len(losses):
                    losses.append(message.loss)
                    bar.update(1)
                    bar.set_postfix(loss=f"{message.loss:.4f}")
                send_more()
        except grpc.RpcError as e:
            raise AttnserveError.from_rpc_error(e) from None
        except BaseException:
            # Ctrl-C or a bug on our side: abort the job so nothing is published, then wait for
            # the server to confirm.
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
        if commit and not committed:
            raise AttnserveError(grpc.StatusCode.UNKNOWN,
                                 f"job {job_id} ended after {len(losses)} steps without a "
                                 "committed version")
        return FineTuneResult(job_id=job_id, base_version=base, committed_version=committed,
                              steps=len(losses), losses=losses, warnings=warnings,
                              evaluations=evaluations, promoted=promoted, promotion=promotion)
