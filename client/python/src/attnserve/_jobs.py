"""Server-side fine-tuning jobs: the dataset upload, and Job / JobEvent as dataclasses."""
from __future__ import annotations

import dataclasses
import hashlib
import queue
from typing import Iterator, List, Optional, Sequence

from attnserve.v1 import trainer_pb2 as tpb

STATES = {
    tpb.JOB_STATE_UNSPECIFIED: "unspecified",
    tpb.JOB_PENDING: "pending",
    tpb.JOB_RUNNING: "running",
    tpb.JOB_SUCCEEDED: "succeeded",
    tpb.JOB_FAILED: "failed",
    tpb.JOB_CANCELLED: "cancelled",
}
ENDED = ("succeeded", "failed", "cancelled")


@dataclasses.dataclass(frozen=True)
class Dataset:
    """The uploaded dataset as the server recorded it."""

    examples: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Job:
    """A server-side fine-tuning job (Client.create_job, job, jobs, watch_job, cancel_job)."""

    job_id: str
    model: str
    # "pending", "running", "succeeded", "failed" or "cancelled".
    state: str
    created_utc: str
    started_utc: str
    ended_utc: str
    base_version: str
    objective: str
    epochs: int
    batch_size: int
    # Steps done, of total_steps.
    step: int
    total_steps: int
    # The last step's loss (0 before the first).
    loss: float
    dataset: Dataset
    description: str
    promote: bool
    # "succeeded": the committed version, whether it is now served by default and why.
    committed_version: str
    promoted: bool
    promotion: str
    # "failed", "cancelled": why, and the status code's name.
    error: str
    error_code: str
    # "pending": jobs ahead of it (0 = next).
    queue_position: int
    # Events recorded so far (job_events replays 0 .. events - 1).
    events: int
    # Client.job() only: the spec as created (a trainer_pb2.JobSpec).
    spec: Optional[tpb.JobSpec] = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED


@dataclasses.dataclass(frozen=True)
class JobList:
    """A model's jobs, newest first, and its queue (Client.jobs); iterates over the jobs."""

    jobs: List[Job]
    # Jobs waiting now and the most that may (--max-queued-jobs).
    queued: int
    max_queued_jobs: int

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, index: int) -> Job:
        return self.jobs[index]


@dataclasses.dataclass(frozen=True)
class Progress:
    """One training step (FineTuneProgress), as a job's step events carry it."""

    step: int
    loss: float
    grad_norm: float
    learning_rate: float
    examples_per_second: float
    examples_seen: int
    # The final event of a job that committed: the version, promoted or staged, and why.
    committed_version: str = ""
    promoted: bool = False
    promotion: str = ""
    warnings: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class JobEvent:
    """Something that happened to a job: queued, started, a step, ended (Client.job_events)."""

    index: int
    time_utc: str
    # The job's state after this event.
    state: str
    # In words: "queued (1 job ahead)", "started from version base", ...
    message: str
    # Step events and the final event of a job that committed.
    progress: Optional[Progress] = None


def job(message: tpb.Job, with_spec: bool = False) -> Job:
    return Job(
        job_id=message.job_id, model=message.model, state=STATES.get(message.state, "unknown"),
        created_utc=message.created_utc, started_utc=message.started_utc,
        ended_utc=message.ended_utc, base_version=message.base_version,
        objective=message.objective, epochs=message.epochs, batch_size=message.batch_size,
        step=message.step, total_steps=message.total_steps, loss=message.loss,
        dataset=Dataset(examples=message.dataset.examples, bytes=message.dataset.bytes,
                        sha256=message.dataset.sha256),
        description=message.description, promote=message.promote,
        committed_version=message.committed_version, promoted=message.promoted,
        promotion=message.promotion, error=message.error, error_code=message.error_code,
        queue_position=message.queue_position, events=message.events,
        spec=message.spec if with_spec and message.HasField("spec") else None)


def job_list(response: tpb.ListJobsResponse) -> JobList:
    return JobList(jobs=[job(j) for j in response.jobs], queued=response.queued,
                   max_queued_jobs=response.max_queued_jobs)


def event(message: tpb.JobEvent) -> JobEvent:
    progress = None
    if message.HasField("progress"):
        p = message.progress
        progress = Progress(step=p.step, loss=p.loss, grad_norm=p.grad_norm,
                            learning_rate=p.learning_rate,
                            examples_per_second=p.examples_per_second,
                            examples_seen=p.examples_seen, committed_version=p.committed_version,
                            promoted=p.promoted, promotion=p.promotion,
                            warnings=list(p.warnings))
    return JobEvent(index=message.index, time_utc=message.time_utc,
                    state=STATES.get(message.state, "unknown"), message=message.message,
                    progress=progress)


def varint(value: int) -> bytes:
    """`value` as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def dataset_bytes(examples: Sequence[tpb.TrainingExample]) -> bytes:
    """The examples in protobuf's delimited format (each preceded by its size as a varint), the
    bytes CreateJob uploads and attnctl finetune --detach sends for the same examples."""
    parts = []
    for example in examples:
        data = example.SerializeToString()
        parts.append(varint(len(data)))
        parts.append(data)
    return b"".join(parts)


def upload_requests(spec: tpb.JobSpec, data: bytes,
                    chunk_sizes: "queue.Queue[int]") -> Iterator[tpb.CreateJobRequest]:
    """The CreateJob request stream: the spec, then, once the server has accepted it (its largest
    chunk size arrives on `chunk_sizes`; 0 when the call ended instead), the dataset in chunks,
    in order. A refused spec costs no upload."""
    yield tpb.CreateJobRequest(spec=spec)
    chunk_bytes = chunk_sizes.get()
    if chunk_bytes <= 0:
        return
    for index, start in enumerate(range(0, len(data), chunk_bytes)):
        yield tpb.CreateJobRequest(
            chunk=tpb.DatasetChunk(index=index, data=data[start:start + chunk_bytes]))


def dataset_info(data: bytes, examples: int) -> tpb.DatasetInfo:
    return tpb.DatasetInfo(bytes=len(data), examples=examples,
                           sha256=hashlib.sha256(data).hexdigest())
