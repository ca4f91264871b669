"""Client.explain's options and results: why a query and a document are similar."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np

from attnserve import _convert
from attnserve._convert import Token
from attnserve.v1 import encoder_pb2 as pb

METHODS = {
    "pairwise": pb.ATTRIBUTION_PAIRWISE,
    "integrated_gradients": pb.ATTRIBUTION_INTEGRATED_GRADIENTS,
    "ig": pb.ATTRIBUTION_INTEGRATED_GRADIENTS,
    "gradient_x_input": pb.ATTRIBUTION_GRADIENT_X_INPUT,
    "gxi": pb.ATTRIBUTION_GRADIENT_X_INPUT,
}
BASELINES = {
    "pad": pb.BASELINE_PAD_TOKENS,
    "mask": pb.BASELINE_MASK_TOKENS,
    "zero": pb.BASELINE_ZERO,
}


@dataclasses.dataclass(frozen=True)
class Attributions:
    """Contributions of one text's tokens (or words) to the similarity."""

    # (T,) integrated gradients: sums to similarity - baseline_similarity (up to the
    # completeness error); empty for method "gradient_x_input".
    integrated_gradients: np.ndarray
    # (T,) gradient x input at the text itself.
    gradient_x_input: np.ndarray
    # The similarity with this text replaced by its baseline.
    baseline_similarity: float


@dataclasses.dataclass(frozen=True)
class Word:
    """Word pieces joined into a word (word_level=True), with its summed attributions."""

    text: str
    char_start: int
    char_end: int
    # Its tokens: tokens[first_token : first_token + num_tokens].
    first_token: int
    num_tokens: int
    integrated_gradients: float
    gradient_x_input: float
    special: bool


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why the query and one document are similar (Client.explain, one per document)."""

    # The dot product of the pooled, normalised embeddings (the cosine for MiniLM).
    similarity: float
    query_tokens: List[Token]
    document_tokens: List[Token]
    query: Attributions
    document: Attributions
    # method "pairwise": (T_query, T_document) token-pair attributions; else None.
    pair_matrix: Optional[np.ndarray]
    baselines_similarity: float
    # How exactly the attributions add up to their target: |attribution_sum - target|.
    completeness_error: float
    attribution_sum: float
    completeness_target: float
    # word_level=True: the words of each text and the (words_query, words_document) matrix.
    query_words: List[Word]
    document_words: List[Word]
    word_pair_matrix: Optional[np.ndarray]
    inference_ms: float

    def top_pairs(self, n: int = 5) -> List[tuple]:
        """The n largest pair cells as (query token, document token, value), largest first."""
        if self.pair_matrix is None:
            return []
        order = np.argsort(-self.pair_matrix, axis=None, kind="stable")[:n]
        rows, cols = np.unravel_index(order, self.pair_matrix.shape)
        return [(self.query_tokens[i].text, self.document_tokens[j].text,
                 float(self.pair_matrix[i, j])) for i, j in zip(rows, cols)]


def _attributions(message: pb.TextAttributions) -> Attributions:
    return Attributions(
        integrated_gradients=np.asarray(message.integrated_gradients, dtype=np.float32),
        gradient_x_input=np.asarray(message.gradient_x_input, dtype=np.float32),
        baseline_similarity=message.baseline_similarity)


def _words(messages: List[pb.Word]) -> List[Word]:
    return [Word(text=w.text, char_start=w.char_start, char_end=w.char_end,
                 first_token=w.first_token, num_tokens=w.num_tokens,
                 integrated_gradients=w.integrated_gradients,
                 gradient_x_input=w.gradient_x_input, special=w.special) for w in messages]


def explanation(result: pb.ExplainResult) -> Explanation:
    return Explanation(
        similarity=result.similarity, query_tokens=_convert.tokens(result.query_tokens),
        document_tokens=_convert.tokens(result.document_tokens),
        query=_attributions(result.query), document=_attributions(result.document),
        pair_matrix=_convert.optional_tensor(result, "pair_matrix"),
        baselines_similarity=result.baselines_similarity,
        completeness_error=result.completeness_error, attribution_sum=result.attribution_sum,
        completeness_target=result.completeness_target,
        query_words=_words(list(result.query_words)),
        document_words=_words(list(result.document_words)),
        word_pair_matrix=_convert.optional_tensor(result, "word_pair_matrix"),
        inference_ms=result.inference_ms)
