"""Models and their versions as dataclasses: ModelInfo, VersionInfo, diff and neighbors results."""
from __future__ import annotations

import dataclasses
from typing import List

import numpy as np

from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import trainer_pb2 as tpb


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """A served model and version (GetModelInfo / ListModels), field for field."""

    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    type_vocab_size: int
    max_position_embeddings: int
    # Truncation length when a call gives max_length=0.
    default_max_length: int
    default_pooling: str
    default_normalize: bool
    parameter_count: int
    precision: str
    # The version answering by default, and where it came from.
    version: str
    version_origin: str
    available_versions: List[str]
    max_inputs_per_request: int
    # The model's name on the server (--model NAME=DIR) and whether it is the default one.
    name: str
    is_default: bool


def model_info(message: pb.ModelInfo) -> ModelInfo:
    values = {f.name: getattr(message, f.name) for f in dataclasses.fields(ModelInfo)}
    values["available_versions"] = list(message.available_versions)
    return ModelInfo(**values)


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


def versions_of(response: tpb.ListVersionsResponse) -> List[VersionInfo]:
    return [VersionInfo(version=v.version, origin=v.origin, created_utc=v.created_utc,
                        serving=v.serving, description=v.description, notes=list(v.notes),
                        staged=v.staged)
            for v in response.versions]


@dataclasses.dataclass(frozen=True)
class MatrixChange:
    """One weight tensor's relative change ||W_B - W_A|| / ||W_A|| (layer -1: embeddings)."""

    layer: int
    # word_embeddings, ..., query, key, value, attention_output, ..., ffn_norm, head
    matrix: str
    # "weight" or "bias"
    part: str
    relative_change: float
    norm_a: float
    norm_diff: float


@dataclasses.dataclass(frozen=True)
class HeadChange:
    layer: int
    head: int
    query_change: float
    key_change: float
    value_change: float
    # Mean Jensen-Shannon divergence between A's and B's attention rows (at most ln 2).
    attention_js: float


@dataclasses.dataclass(frozen=True)
class EmbeddingDrift:
    """How the pooled embeddings of the probe texts moved from A to B."""

    probes: int
    mean_cosine: float
    min_cosine: float
    min_cosine_probe: int
    spearman: float
    neighbour_overlap: float
    neighbours_k: int


@dataclasses.dataclass(frozen=True)
class VersionDiff:
    """What changed between two versions (Client.diff, the CompareVersions RPC)."""

    model: str
    version_a: str
    version_b: str
    matrices: List[MatrixChange]
    # Every head, layer-major.
    heads: List[HeadChange]
    # The heads whose attention moved most, largest first.
    most_changed_heads: List[HeadChange]
    drift: EmbeddingDrift
    # Whether vectors of A can stay in an index queried with B, and why.
    can_mix: bool
    verdict: str
    default_probes: bool
    seconds: float

    def relative_change(self, matrix: str, layer: int, part: str = "weight") -> float:
        """The relative change of one tensor, e.g. relative_change("ffn_out", 5)."""
        for m in self.matrices:
            if (m.matrix, m.layer, m.part) == (matrix, layer, part):
                return m.relative_change
        raise KeyError(f"no tensor {matrix!r} {part} in layer {layer}")


def _head(h: tpb.HeadChange) -> HeadChange:
    return HeadChange(layer=h.layer, head=h.head, query_change=h.query_change,
                      key_change=h.key_change, value_change=h.value_change,
                      attention_js=h.attention_js)


def version_diff(response: tpb.CompareVersionsResponse) -> VersionDiff:
    d = response.drift
    return VersionDiff(
        model=response.model, version_a=response.version_a, version_b=response.version_b,
        matrices=[MatrixChange(layer=m.layer, matrix=m.matrix, part=m.part,
                               relative_change=m.relative_change, norm_a=m.norm_a,
                               norm_diff=m.norm_diff) for m in response.matrices],
        heads=[_head(h) for h in response.heads],
        most_changed_heads=[_head(h) for h in response.most_changed_heads],
        drift=EmbeddingDrift(probes=d.probes, mean_cosine=d.mean_cosine,
                             min_cosine=d.min_cosine, min_cosine_probe=d.min_cosine_probe,
                             spearman=d.spearman, neighbour_overlap=d.neighbour_overlap,
                             neighbours_k=d.neighbours_k),
        can_mix=response.can_mix, verdict=response.verdict,
        default_probes=response.default_probes, seconds=response.seconds)


@dataclasses.dataclass(frozen=True)
class TokenNeighbor:
    token_id: int
    token: str
    cosine: float


@dataclasses.dataclass(frozen=True)
class Neighbors:
    """A word's nearest vocabulary tokens, and its contextual cosines (Client.neighbors)."""

    model_version: str
    # The word's sub-tokens.
    word_token_ids: List[int]
    word_tokens: List[str]
    # Nearest rows of the word-embedding table, most similar first.
    static: List[TokenNeighbor]
    # With sentences: the hidden layer used and the (sentences x sentences) cosine matrix.
    layer: int
    contextual: np.ndarray


def neighbors(response: tpb.NeighborsResponse, sentences: int) -> Neighbors:
    cosine = np.asarray(response.contextual_cosine, dtype=np.float64)
    return Neighbors(
        model_version=response.model_version, word_token_ids=list(response.word_token_ids),
        word_tokens=list(response.word_tokens),
        static=[TokenNeighbor(token_id=n.token_id, token=n.token, cosine=n.cosine)
                for n in response.static_neighbors],
        layer=response.layer,
        contextual=cosine.reshape(sentences, sentences) if sentences else cosine.reshape(0, 0))
