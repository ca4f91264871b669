#!/usr/bin/env python3
"""Writes harness_cosine_sentences.txt: the 256 sentences bench/harness.py's full run uses for its
pooled-cosine rows (precision vs fp32), so engine tests bound the same set.

It repeats harness.make_inputs' selection: sentence_pool(4000), token counts (attn-embed, which
tokenizes like the harness's own worker), the 64-sentence mixed batch chosen first, then the
first 256 unused pool sentences of at most 128 tokens. Run after a build:
  python3 tests/data/make_harness_sentences.py build/engine/attn-embed
"""
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bench"))
import sentences  # noqa: E402

MIXED_COUNT, MIXED_SHORTEST, MIXED_LONGEST, COSINE_COUNT = 64, 5, 128, 256


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    pool = sentences.sentence_pool(4000)
    out = subprocess.run([sys.argv[1], "--max_length=512", "--batch_size=64"],
                         input="\n".join(pool) + "\n", capture_output=True, text=True, check=True)
    lengths = [json.loads(line)["num_tokens"] for line in out.stdout.splitlines()]
    assert len(lengths) == len(pool)
    targets = [round(MIXED_SHORTEST + i * (MIXED_LONGEST - MIXED_SHORTEST) / (MIXED_COUNT - 1))
               for i in range(MIXED_COUNT)]
    candidates = [i for i, n in enumerate(lengths) if n <= MIXED_LONGEST]
    used = set()
    for target in targets:
        used.add(min((i for i in candidates if i not in used),
                     key=lambda i: (abs(lengths[i] - target), i)))
    cosine = [i for i in candidates if i not in used][:COSINE_COUNT]
    (HERE / "harness_cosine_sentences.txt").write_text("".join(pool[i] + "\n" for i in cosine))


if __name__ == "__main__":
    main()
