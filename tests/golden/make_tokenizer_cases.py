#!/usr/bin/env python3
"""Reference data for attn::WordPieceTokenizer, made by Hugging Face's BertTokenizerFast.

Default mode writes tests/golden/tokenizer_cases.json: for each case the input (text, text_pair,
max_length, truncation_side) and what BertTokenizerFast returns for it (input_ids,
token_type_ids, tokens, offset_mapping in code points).

--emit-cpp-tables prints the code point tables engine/tokenizer.cc embeds instead: which code
points the `tokenizers` crate treats as control, nonspacing mark and punctuation (its
unicode_categories tables are Unicode 9, so utf8proc's newer categories disagree on several
hundred code points), and which it treats as non-starters in NFD's canonical ordering.

See README_tokenizer.md for the exact commands and versions.
"""

import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_MODEL = os.path.join(REPO, "models", "all-MiniLM-L6-v2")
DEFAULT_OUT = os.path.join(HERE, "tokenizer_cases.json")


def single_texts():
    """Texts encoded alone, without truncation, grouped by what they exercise."""
    plain = [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "This is a simple sentence.",
        "Transformers provide contextual embeddings for every token.",
        "unaffable",
        "The embedding of a sentence is the mean of its token vectors.",
        "I can't believe it's not butter!",
        "She said: \"attention is all you need\".",
        "Tokenization splits text into word pieces like ##ing.",
        "a",
        "A",
        "hello",
        "antidisestablishmentarianism",
        "supercalifragilisticexpialidocious",
        "pneumonoultramicroscopicsilicovolcanoconiosis",
    ]
    mixed_case = [
        "HELLO WORLD",
        "Hello World",
        "hElLo WoRlD",
        "iPhone eBay McDonald's",
        "NASA's JSON-RPC API over HTTP/2",
        "CamelCaseIdentifierName and snake_case_name",
        "MiXeD123CaSe456",
        "ALL CAPS SENTENCE WITH NUMBERS 2024",
    ]
    accents = [
        "café",
        "naïve",
        "Ångström",
        "résumé",
        "cafe\u0301",  # e + combining acute
        "e\u0301\u0323",  # two combining marks (reordered by NFD)
        "Zoë Brontë",
        "Straße STRASSE",
        "ÆØÅ æøå",
        "Zażółć gęślą jaźń",
        "Tiếng Việt có dấu",
        "İstanbul ıi",
        "ΣΑΣ Ὀδυσσεύς",
        "Привет мир Ёж",
        "Crème brûlée à la française",
        "ñandú pingüino",
        "o\u0308\u0304",
        "\u0301leading combining mark",
        "a\u20dd enclosing",
        "ǅungla ǈ ǋ",
        "ﬁnancial ﬂow",  # ligatures: NFD keeps them
        "Ⅻ ⅻ ℃ ™",
    ]
    cjk = [
        "我爱自然语言处理",
        "中文English混合text",
        "こんにちは世界",
        "カタカナ テスト",
        "日本語のテキストです。",
        "안녕하세요 세계",
        "한국어",
        "\uf900\uf901 compatibility ideographs",
        "𠀀𠀁 extension B",
        "ＡＢＣ１２３ full width",
        "ｶﾀｶﾅ half width",
        "東京タワー",
        "北京是中国的首都。",
        "㐀㐁 extension A",
        "〈括号〉「引号」",
    ]
    emoji = [
        "I love 🍕!",
        "👍🏽",
        "👨‍👩‍👧‍👦 family",
        "❤️ heart",
        "🏳️‍🌈 flag",
        "flags 🇺🇸🇫🇷",
        "text😀text",
        "😀😃😄😁",
        "🤷‍♀️ shrug",
        "👋🏻👋🏿 waves",
        "keycap 1️⃣ #️⃣",
    ]
    scripts = [
        "مرحبا بالعالم",
        "مَرْحَبًا",
        "שָׁלוֹם עולם",
        "नमस्ते दुनिया",
        "สวัสดีชาวโลก",
        "வணக்கம் உலகம்",
        "হ্যালো বিশ্ব",
        "გამარჯობა",
        "Բարեւ աշխարհ",
        "ሰላም ዓለም",
        "ελληνικά γράμματα",
        "Ελληνικά ΓΡΆΜΜΑΤΑ",
    ]
    punctuation = [
        "!!!???",
        "...",
        "—",
        "«»",
        "“quoted” ‘single’",
        "a-b_c",
        "¿Qué? ¡Hola!",
        "…",
        "(parens) [brackets] {braces}",
        "a/b\\c|d",
        "~^`",
        "¶§•",
        "C++ & C#",
        "e.g. i.e. etc.",
        "don't rock'n'roll",
        "@#$%^&*()",
        "a--b---c",
        "·・‧",
        "«Bonjour», dit-il.",
        "【注意】",
        "100%",
        "<html><body>hi</body></html>",
    ]
    numbers = [
        "$1,234.56",
        "3.14159",
        "1e-10",
        "12:30pm",
        "2024-01-15",
        "+1 (555) 123-4567",
        "50% off €99.99 £5 ¥100",
        "½ ¼ ²³",
        "١٢٣ ٤٥٦",
        "१२३",
        "0x1F600 0b1010",
        "1,000,000",
        "-42.0e+3",
    ]
    web = [
        "https://example.com/path?q=1&x=y#frag",
        "user.name+tag@example.co.uk",
        "www.google.com",
        "ftp://files.example.org/pub/file.tar.gz",
        "@handle #hashtag",
        "C:\\Users\\name\\file.txt",
        "mailto:someone@example.com?subject=Hi",
    ]
    control = [
        "a\tb\nc\rd",
        "line1\r\nline2",
        "\x00null\x00",
        "bell\x07char",
        "del\x7fchar",
        "\x1b[31mred\x1b[0m",
        "next\u0085line",
        "form\x0cfeed",
        "vertical\x0btab",
        "\x00\x01\x02",
        "tab\tseparated\tvalues",
        "trailing newline\n",
        "\u0080\u009f C1 controls",
        "private\ue000use\U000f0000",
    ]
    zero_width = [
        "zero\u200bwidth",
        "zw\u200cnj\u200dj",
        "\ufeffBOM",
        "word\u2060joiner",
        "soft\u00adhyphen",
        "\u200e\u200f direction marks",
        "\u202aembedded\u202c",
        "mongolian\u180evowel",
    ]
    spaces = [
        "a\u00a0b",
        "a\u2003b\u2009c",
        "a\u3000b",
        "a\u202fb",
        "a\u205fb",
        "a\u1680b",
        "a\u2028b\u2029c",
        "   leading and trailing   ",
        "multiple     spaces",
        "\u00a0\u00a0",
    ]
    replacement = [
        "bad\ufffdchar",
        "\ufffd",
        "\ufffd\ufffd x \ufffd",
    ]
    long_words = [
        "a" * 200,
        "ab" * 50,  # exactly 100 chars
        "ab" * 50 + "a",  # 101 chars
        "x" * 99 + " " + "y" * 101,
        "é" * 100,  # 100 chars before and after normalization
        "e\u0301" * 60,  # 120 chars in, 60 after stripping accents
        "한" * 40,  # 40 syllables in, 120 jamo after NFD
        "한" * 33,  # 99 jamo
        "한" * 34,  # 102 jamo
        "İ" * 101,
        "word " * 5 + "z" * 150 + " end",
    ]
    unsegmentable = [
        "☃☃",
        "xyz☃",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
        "ᚠᚢᚦ",
        "qwzxv",
        "☃ snowman",
        "abc\u2581def",
        "𝒜𝒷𝒸 test 😀 end",
    ]
    empty = [
        "",
        " ",
        "   ",
        "\t\n",
        "\x00\x01",
        "\u200b",
    ]
    special_in_text = [
        "hello [SEP] world",
        "[CLS][MASK][PAD][UNK]",
        "[sep] lowercase is not special",
        "[SEP",
        "x[MASK]y",
        "[[SEP]]",
        "Ünïcödé [SEP] ☃",
    ]
    # Code points where utf8proc (Unicode 15) and the tokenizers crate (Unicode 9 categories,
    # Rust's lowercase) disagree.
    table_edges = [
        "x\u0890y",  # Cf since Unicode 14: kept
        "x\u09fdy",  # Po since Unicode 10: not punctuation
        "x\u166dy",  # Po in Unicode 9 (So now): punctuation
        "x\u1734y",  # Mn in Unicode 9 (Mc now): stripped
        "x\U00011938y",  # NFD since Unicode 13: not decomposed
        "x\ua7cby",  # lowercase since Unicode 16
        "x\u1c89y",  # lowercase since Unicode 16
        "x\u07fdy",  # Mn since Unicode 11: kept
        "x\u061dy",  # Po since Unicode 14
        "x\U000111c9y",  # Po in Unicode 9 (Mn now)
        "x\u0378y",  # unassigned: kept
    ]
    groups = [plain, mixed_case, accents, cjk, emoji, scripts, punctuation, numbers, web, control,
              zero_width, spaces, replacement, long_words, unsegmentable, empty, special_in_text,
              table_edges]
    return [t for g in groups for t in g]


def random_texts(n, seed=1234):
    """Deterministic mixtures of characters from many classes, to catch interactions."""
    rng = random.Random(seed)
    pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    pool += list(" \t\n.,;:!?-'\"()[]{}#$%&*+/<=>@\\^_`|~")
    pool += list("éèêëàâäôöûüçñÅßØæœ")
    pool += ["\u0301", "\u0308", "\u0327", "\u200b", "\u200d", "\u00a0", "\u3000", "\ufffd",
             "\x00", "\x07", "\x7f", "\ufeff", "\u00ad"]
    pool += list("我爱中文字こんにちはカタ한국어")
    pool += ["😀", "👍", "🏽", "🍕", "❤", "\ufe0f", "—", "«", "»", "…", "“", "”", "€", "£"]
    pool += list("مرحباשלוםनमस्तेสวัสดีПривет")
    pool += ["\U0001d518", "\U00020000", "\uf900", "ǅ", "İ", "ﬁ", "½", "²"]
    texts = []
    for _ in range(n):
        length = rng.randint(1, 40)
        texts.append("".join(rng.choice(pool) for _ in range(length)))
    return texts


def long_text(words):
    base = ("the model reads every token and attends to all of the others , then pools "
            "them into one vector").split()
    return " ".join(base[i % len(base)] for i in range(words))


def build_cases():
    cases = []  # (text, text_pair, max_length, truncation_side)
    for t in single_texts():
        cases.append((t, None, None, "right"))
    for t in random_texts(40):
        cases.append((t, None, None, "right"))

    pairs = [
        ("How are you?", "I am fine, thanks."),
        ("", "second text only"),
        ("first text only", ""),
        ("", ""),
        ("Question with émoji 😀", "答案是这个"),
        ("What is the capital of France?", "Paris is the capital and most populous city of France."),
        ("hello [SEP] there", "general [CLS] kenobi"),
        ("tab\tand\nnewline", "\x00control\u200b"),
        ("a" * 120, "b"),
        ("İstanbul", "ISTANBUL"),
    ]
    for a, b in pairs:
        cases.append((a, b, None, "right"))

    sentence = "The quick brown fox jumps over the lazy dog near the river bank today."
    other = "A second sentence that is somewhat longer than the first one, with commas."
    short = "Short one."
    five_a, five_b = "one two three four five", "six seven eight nine ten"
    for side in ("right", "left"):
        for max_length in (8, 16):
            cases.append((sentence, None, max_length, side))
            cases.append((sentence, other, max_length, side))
            cases.append((short, other, max_length, side))
            cases.append((other, short, max_length, side))
        # Equal lengths: the crate gives the extra token to the second text, (3, 4) for 7.
        cases.append((five_a, five_b, 10, side))
        cases.append((five_a, five_b, 11, side))
        cases.append((five_a, "six seven eight nine", 10, side))
        cases.append((five_a, five_b, 3, side))  # only the special tokens remain
        cases.append((sentence, None, 2, side))
        cases.append(("", sentence, 9, side))
        cases.append(("exact fit", None, 4, side))  # no truncation needed
        cases.append(("a b c d e f", "g h", 7, side))  # only the longer is cut
        cases.append(("😀 emoji café naïve test", "日本語のテキスト", 9, side))
        cases.append((long_text(600), None, 512, side))  # exactly 512 tokens after truncation
        cases.append((long_text(400), long_text(300), 512, side))
    cases.append((long_text(510), None, 512, "right"))  # 512 with nothing to cut
    return cases


def encode_cases(model_dir):
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast.from_pretrained(model_dir)
    out = []
    for text, pair, max_length, side in build_cases():
        tok.truncation_side = side
        kwargs = dict(return_offsets_mapping=True, add_special_tokens=True)
        if max_length is not None:
            kwargs.update(truncation=True, max_length=max_length)
        else:
            kwargs.update(truncation=False)
        if pair is not None:
            # The batch form: for a single call transformers drops a falsy text_pair ("" encodes
            # as a single text), while its batch path and the tokenizers crate keep the pair.
            batch = tok([text], [pair], **kwargs)
            enc = {key: batch[key][0] for key in ("input_ids", "token_type_ids", "offset_mapping")}
        else:
            enc = tok(text, **kwargs)
        ids = list(enc["input_ids"])
        out.append({
            "text": text,
            "text_pair": pair,
            "max_length": max_length,
            "truncation_side": side,
            "input_ids": ids,
            "token_type_ids": list(enc["token_type_ids"]),
            "tokens": tok.convert_ids_to_tokens(ids),
            "offset_mapping": [list(o) for o in enc["offset_mapping"]],
        })
    return out


def emit_cpp_tables():
    """Prints the C++ range tables for engine/tokenizer.cc, probing every code point."""
    from tokenizers.normalizers import NFD, BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    clean_only = BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                                lowercase=False)
    strip_only = BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True,
                                lowercase=False)
    nfd = NFD()
    pre = BertPreTokenizer()
    control, mark, punct, nonstarter = set(), set(), set(), set()
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if cp not in (0, 0xFFFD) and clean_only.normalize_str("a" + c + "a") == "aa":
            control.add(cp)
        stripped = strip_only.normalize_str(c)
        if stripped == "":
            # Removed by strip_accents: a nonspacing mark, or decomposes into only such marks
            # (the C++ side asks only after decomposing, so both may share the table).
            mark.add(cp)
        if cp >= 0x80 and len(pre.pre_tokenize_str("a" + c + "a")) == 3:
            punct.add(cp)
        # Non-starter (canonical combining class > 0) in the crate's NFD data: NFD moves it
        # across U+0301 (class 230) or U+0334 (class 1). Only code points that are their own
        # NFD are asked about.
        if cp >= 0x300 and nfd.normalize_str(c) == c and (
                nfd.normalize_str("a\u0301" + c) != "a\u0301" + c
                or nfd.normalize_str("a" + c + "\u0334") != "a" + c + "\u0334"):
            nonstarter.add(cp)

    def ranges(s):
        r = []
        for cp in sorted(s):
            if r and r[-1][1] == cp - 1:
                r[-1][1] = cp
            else:
                r.append([cp, cp])
        return r

    def print_table(name, comment, s):
        print("// %s" % comment)
        print("constexpr CpRange %s[] = {" % name)
        items = ["{0x%X, 0x%X}" % (a, b) for a, b in ranges(s)]
        line = "   "
        for item in items:
            if len(line) + len(item) + 2 > 100:
                print(line)
                line = "   "
            line += " " + item + ","
        print(line)
        print("};")
        print()

    print_table("kControlRanges", "Cc, Cf, Co (is_other), minus \\t \\n \\r.", control)
    print_table("kNonspacingMarkRanges", "Mn (and code points whose NFD is only Mn).", mark)
    print_table("kPunctuationRanges", "P* at or above U+0080 (ASCII is handled separately).",
                punct)
    print_table("kNonStarterRanges", "Combining class > 0; the value itself comes from utf8proc.",
                nonstarter)
    # Lowercase and NFD come from utf8proc; the few places where the crate differs (newer
    # lowercase pairs, U+11938) are written by hand in tokenizer.cc and covered by the cases.


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=DEFAULT_MODEL)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--emit-cpp-tables", action="store_true")
    args = parser.parse_args()
    if args.emit_cpp_tables:
        emit_cpp_tables()
        return
    cases = encode_cases(args.model_dir)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("[\n")
        for i, case in enumerate(cases):
            f.write(json.dumps(case, ensure_ascii=False))
            f.write(",\n" if i + 1 < len(cases) else "\n")
        f.write("]\n")
    print("wrote %d cases to %s (%d bytes)" % (len(cases), args.out, os.path.getsize(args.out)),
          file=sys.stderr)


if __name__ == "__main__":
    main()
