"""The Trainer service's calls (Client's second half): versions, diff, neighbors, evaluation,
fine-tuning on the client's stream (finetune) and as server-side jobs. They send the trainer
token; each takes `model=` like the Encoder calls."""
from __future__ import annotations

import queue
from typing import Iterator, List, Optional, Sequence, Union

import grpc

from attnserve import _evaluation, _finetune, _jobs, _versions
from attnserve._base import Connection
from attnserve._finetune import FineTuneResult, TrainingData
from attnserve._jobs import Job, JobEvent, JobList
from attnserve._versions import Neighbors, VersionDiff, VersionInfo
from attnserve.errors import error
from attnserve.v1 import trainer_pb2 as tpb


class TrainerCalls(Connection):
    def _trainer_call(self, name: str, request: object) -> object:
        return self._call(getattr(self._trainer, name), request, trainer=True)

    # --- versions ------------------------------------------------------------------------------
    def versions(self, *, model: Optional[str] = None) -> List[VersionInfo]:
        """Committed versions, oldest first (`.serving` marks the default, `.staged` the ones
        never served by default)."""
        return _versions.versions_of(self._trainer_call(
            "ListVersions", tpb.ListVersionsRequest(model=self._model(model))))

    def promote(self, version: str, *, model: Optional[str] = None) -> List[VersionInfo]:
        """Serve a committed (staged) version by default, recorded in the model store."""
        return _versions.versions_of(self._trainer_call(
            "Promote", tpb.PromoteRequest(version=version, model=self._model(model))))

    def rollback(self, version: str = "", *, model: Optional[str] = None) -> List[VersionInfo]:
        """Serve again the version served before the current one (or `version`, served before)."""
        return _versions.versions_of(self._trainer_call(
            "Rollback", tpb.RollbackRequest(version=version, model=self._model(model))))

    def set_serving_version(self, version: str, *,
                            model: Optional[str] = None) -> List[VersionInfo]:
        """Serve `version` by default (attnctl serve-version)."""
        return _versions.versions_of(self._trainer_call(
            "SetServingVersion",
            tpb.SetServingVersionRequest(version=version, model=self._model(model))))

    def diff(self, version_a: str, version_b: str, *, probes: Optional[Sequence[str]] = None,
             model_b: str = "", top_heads: int = 0,
             model: Optional[str] = None) -> VersionDiff:
        """What changed from version_a to version_b ("base" or committed versions): each weight
        tensor's relative change, per-head attention change, the drift of the probe texts'
        embeddings and whether vectors of one can be mixed with the other's (`can_mix`,
        `verdict`). probes: 11 to 1,000 texts (None = the server's 200 built-in sentences)."""
        request = tpb.CompareVersionsRequest(
            model=self._model(model), version_a=version_a, version_b=version_b,
            probes=list(probes or []), model_b=model_b, top_heads=top_heads)
        return _versions.version_diff(self._trainer_call("CompareVersions", request))

    def neighbors(self, word: str = "", *, token_id: Optional[int] = None, version: str = "",
                  top_k: int = 0, sentences: Sequence[str] = (), layer: Optional[int] = None,
                  model: Optional[str] = None) -> Neighbors:
        """A word's (or token id's) nearest tokens in the version's static word-embedding table
        (`.static`, top_k of them, 0 = 10) and, given sentences containing it, the cosine matrix
        of its contextual embeddings across them at `layer` (None = the last): `.contextual`."""
        request = tpb.NeighborsRequest(model=self._model(model), version=version, word=word,
                                       top_k=top_k, sentences=list(sentences))
        if token_id is not None:
            request.token_id = token_id
        if layer is not None:
            request.layer = layer
        return _versions.neighbors(self._trainer_call("Neighbors", request), len(sentences))

    # --- evaluation ----------------------------------------------------------------------------
    def evaluate(self, data: _evaluation.EvaluationData, *, version: str = "",
                 max_length: int = 0, model: Optional[str] = None) -> _evaluation.Evaluation:
        """Scores `version` ("" = the served one) on held-out data without training.

        data: a JSON Lines file or dicts, one example each (the task is told from the first):
        retrieval {"query": ..., "item": ...} ({"item": ...} alone adds a distractor),
        contrastive pairs (each anchor retrieves its positive), {"first", "second", "score"}
        (Spearman), {"text", "label"} or {"first", "second", "label"} (a version with a
        classification head: accuracy, macro-F1). At most 5,000 texts.
        """
        from attnserve import _convert

        request = tpb.EvaluateRequest(
            model=self._model(model), version=version,
            evaluation=_evaluation.evaluation_set(data),
            tokenization=_convert.tokenization(max_length, None))
        return _evaluation.from_proto(self._trainer_call("Evaluate", request))

    def training_report(self, version: str, *,
                        model: Optional[str] = None) -> _evaluation.TrainingReport:
        """What the job that committed `version` recorded: settings, losses, evaluations, the
        promotion decision, how far each parameter group moved."""
        return _evaluation.report_from_proto(self._trainer_call(
            "GetTrainingReport",
            tpb.GetTrainingReportRequest(version=version, model=self._model(model))))

    # --- fine-tuning on this client's stream ---------------------------------------------------
    def finetune(self, data: TrainingData, objective: Union[str, int], *, batch_size: int = 16,
                 epochs: int = 1, learning_rate: float = 0.0, num_labels: int = 0,
                 label_names: Optional[Sequence[str]] = None, parameters: Union[str, int] = "all",
                 seed: int = 0, shuffle: bool = True, warmup_steps: int = 0,
                 total_steps: int = 0, disable_dropout: bool = False, base_version: str = "",
                 max_length: int = 0, commit: bool = True, description: str = "",
                 promote: bool = False, serve: Optional[bool] = None, progress: bool = True,
                 batches_in_flight: int = 2,
                 eval_data: Optional[_evaluation.EvaluationData] = None, eval_every: int = 0,
                 promote_if: str = "", precision: str = "float32",
                 model: Optional[str] = None) -> FineTuneResult:
        """Fine-tunes on `data` over this client's stream and commits a new version (or aborts
        with commit=False). The job lives as long as the call: create_job() runs one on the
        server instead.

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
            disable_dropout=disable_dropout, base_version=base_version, max_length=max_length,
            precision=precision, eval_data=eval_data, eval_every=eval_every,
            promote_if=promote_if, model=self._model(model))
        promote = promote or bool(promote_if)
        commit_request = (tpb.FineTuneRequest(commit=tpb.CommitRequest(
            description=description, promote=promote)) if commit
            else tpb.FineTuneRequest(abort=True))
        try:
            return _finetune.stream(self._trainer.FineTune, self._trainer_metadata, job_config,
                                    todo, commit_request, progress, batches_in_flight)
        except grpc.RpcError as e:
            raise self._error(e, trainer=True) from None

    # --- server-side jobs ----------------------------------------------------------------------
    def create_job(self, data: TrainingData, objective: Union[str, int], *, epochs: int = 1,
                   batch_size: int = 16, learning_rate: float = 0.0, num_labels: int = 0,
                   label_names: Optional[Sequence[str]] = None,
                   parameters: Union[str, int] = "all", seed: int = 0, warmup_steps: int = 0,
                   total_steps: int = 0, disable_dropout: bool = False, base_version: str = "",
                   max_length: int = 0, description: str = "", promote: bool = False,
                   eval_data: Optional[_evaluation.EvaluationData] = None, eval_every: int = 0,
                   promote_if: str = "", precision: str = "float32",
                   model: Optional[str] = None) -> Job:
        """A fine-tuning job the server runs with no client attached (attnctl finetune --detach):
        uploads the data (checked here, then by the server, with its SHA-256) and returns the
        Job, pending or running. Follow it with watch_job() or job_events(), stop it with
        cancel_job(). The arguments are finetune()'s; the server batches the data (shuffled per
        epoch as finetune and attnctl do) and commits staged unless promote=True (or promote_if
        holds on eval_data)."""
        objective_value = _finetune.objective(objective)
        examples = _finetune.load(data, objective_value)
        spec = tpb.JobSpec(
            config=_finetune.config(
                objective_value, learning_rate=learning_rate, num_labels=num_labels,
                label_names=label_names, parameters_value=_finetune.parameters(parameters),
                seed=seed, warmup_steps=warmup_steps, total_steps=total_steps,
                disable_dropout=disable_dropout, base_version=base_version,
                max_length=max_length, precision=precision, eval_data=eval_data,
                eval_every=eval_every, promote_if=promote_if, model=self._model(model)),
            epochs=epochs, batch_size=batch_size, description=description,
            promote=promote or bool(promote_if))
        payload = _jobs.dataset_bytes(examples)
        spec.dataset.CopyFrom(_jobs.dataset_info(payload, len(examples)))
        chunk_sizes: "queue.Queue[int]" = queue.Queue()
        call = self._trainer.CreateJob(_jobs.upload_requests(spec, payload, chunk_sizes),
                                       metadata=self._trainer_metadata)
        created: Optional[tpb.Job] = None
        try:
            for response in call:
                if response.max_chunk_bytes:
                    chunk_sizes.put(max(1, min(response.max_chunk_bytes, 1 << 20)))
                if response.HasField("job"):
                    created = response.job
        except grpc.RpcError as e:
            raise self._error(e, trainer=True) from None
        finally:
            chunk_sizes.put(0)  # the request stream ends if the server never accepted the spec
        if created is None:
            raise error(grpc.StatusCode.UNKNOWN, "the server ended CreateJob without the job")
        return _jobs.job(created)

    def jobs(self, *, model: Optional[str] = None) -> JobList:
        """The model's jobs, newest first (queued, running and the last 100 that ended), and
        how many wait of the most that may; iterate over it for the jobs."""
        return _jobs.job_list(self._trainer_call(
            "ListJobs", tpb.ListJobsRequest(model=self._model(model))))

    def job(self, job_id: str, *, model: Optional[str] = None) -> Job:
        """One job, with the spec it was created with (`.spec`)."""
        return _jobs.job(self._trainer_call(
            "GetJob", tpb.GetJobRequest(job_id=job_id, model=self._model(model))),
            with_spec=True)

    def cancel_job(self, job_id: str, *, model: Optional[str] = None) -> Job:
        """Stops a job (a queued one at once, a running one after the step under way) and
        returns it once stopped; nothing is published. FailedPrecondition for a job that has
        ended or is committing its version."""
        return _jobs.job(self._trainer_call(
            "CancelJob", tpb.CancelJobRequest(job_id=job_id, model=self._model(model))))

    def job_events(self, job_id: str, *, from_event: int = 0,
                   model: Optional[str] = None) -> Iterator[JobEvent]:
        """The job's events from `from_event` (0 = all), then the new ones as they happen; ends
        after the job's last event. Closing the iterator early stops watching, not the job."""
        call = self._trainer.WatchJob(
            tpb.WatchJobRequest(job_id=job_id, model=self._model(model), from_index=from_event),
            metadata=self._trainer_metadata)
        try:
            for message in call:
                yield _jobs.event(message)
        except grpc.RpcError as e:
            raise self._error(e, trainer=True) from None
        finally:
            call.cancel()

    def watch_job(self, job_id: str, *, from_event: int = 0, progress: bool = True,
                  model: Optional[str] = None) -> Job:
        """Follows a job until it ends, with a tqdm bar of its steps and loss, and returns it as it
        ended (`.state` "succeeded", "failed" or "cancelled"; `.committed_version`). Ctrl-C
        stops watching; the job goes on."""
        from tqdm.auto import tqdm

        current = self.job(job_id, model=model)
        bar = tqdm(total=current.total_steps, initial=0, disable=not progress, unit="step",
                   desc=job_id)
        try:
            for event in self.job_events(job_id, from_event=from_event, model=model):
                if event.progress is not None and event.progress.step > bar.n:
                    bar.set_postfix(loss=f"{event.progress.loss:.4f}", refresh=False)
                    bar.update(event.progress.step - bar.n)
        finally:
            bar.close()
        return self.job(job_id, model=model)
