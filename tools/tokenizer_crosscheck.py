#!/usr/bin/env python3
"""Dev-time cross-check of `klinear tokenize` against OpenAI's tiktoken (not used by CI).

The reference is built offline, exactly as Moonshot's tokenization_kimi.py builds it: a
tiktoken.Encoding from the local tiktoken.model ranks, the Kimi pattern, and the 256 specials of
tokenizer_config.json, with the 400,000-character and 25,000-run cuts applied before encoding.
Nothing is downloaded. Texts are random and mixed (scripts, emoji, whitespace runs, code, digits,
contractions, special-token names, long runs), so agreement is not tuned to the fixture strings.

Usage: python3 tools/tokenizer_crosscheck.py [--cli build/klinear] [--tokenizer tokenizers/kimi-k2]
                                             [--count 300] [--seed N]
Needs: pip install tiktoken (its Rust core runs the pattern, as in the fixture's oracle).
Exit status: 0 when every text agrees, 1 otherwise.
"""
import argparse
import base64
import json
import os
import random
import subprocess
import sys
import tempfile

# tokenization_kimi.py's pattern (docs/DESIGN.md "Chat formats"); `&&` is class intersection.
KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NUM_SPECIALS = 256
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000


def load_encoding(tokenizer_dir):
    import tiktoken

    ranks = {}
    with open(os.path.join(tokenizer_dir, "tiktoken.model"), "rb") as f:
        for line in f.read().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    names = {int(k): v["content"] for k, v in config.get("added_tokens_decoder", {}).items()}
    n = len(ranks)
    specials = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + NUM_SPECIALS)}
    return tiktoken.Encoding(name="kimi", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def split_runs(s, limit):
    """tokenization_kimi.py's _split_whitespaces_or_nonwhitespaces."""
    current_len = 0
    current_is_space = s[0].isspace() if s else False
    start = 0
    for i in range(len(s)):
        is_space = s[i].isspace()
        if current_is_space ^ is_space:
            current_len = 1
            current_is_space = is_space
        else:
            current_len += 1
            if current_len > limit:
                yield s[start:i]
                start = i
                current_len = 1
    yield s[start:]


def reference_encode(enc, text, allow_special):
    ids = []
    for i in range(0, len(text), MAX_ENCODE_CHARS):
        for piece in split_runs(text[i:i + MAX_ENCODE_CHARS], MAX_RUN_CHARS):
            if allow_special:
                ids.extend(enc.encode(piece, allowed_special="all"))
            else:
                ids.extend(enc.encode(piece, disallowed_special=()))
    return ids


RANGES = [(0x61, 0x7A), (0x41, 0x5A), (0x30, 0x39), (0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E),
          (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x3040, 0x30FF), (0xAC00, 0xD7A3),
          (0x0400, 0x04FF), (0x0370, 0x03FF), (0x0600, 0x06FF), (0x0590, 0x05FF), (0x0900, 0x097F),
          (0x0E00, 0x0E7F), (0x0300, 0x036F), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF), (0x00A0, 0x024F),
          (0x3000, 0x303F), (0xFF00, 0xFFEF), (0x2000, 0x206F), (0x2150, 0x218F), (0x1D400, 0x1D7FF),
          (0x0660, 0x0669), (0x1E00, 0x1EFF), (0x2E80, 0x2FDF), (0x31C0, 0x31EF), (0xF900, 0xFAFF)]
FRAGMENTS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n\n", "    ", "\u00a0", "\u3000", "\u200d", "\ufe0f",
             "\u180e", "\u1680", "\u2028", "\x0b", "\x0c", "\x1c", "\x85", "'s", "'S", "'\u017f", "'ll", "'VE",
             "'d", "<|im_end|>", "<|im_user|>", "[BOS]", "[EOS]", "<|reserved_token_163700|>", "<|im_end",
             "getUserName", "HTTPServer", "iPhone", "12345", "3.14159", "-42", "0x1F", "中文", "A中B", "、",
             "def f(x):\n    return x\n", "{\"k\": [1, 2]}", "https://example.com/a?b=c", "😀👩\u200d👩\u200d👧",
             "e\u0301", "ǅungla", "ﬁne", "Ⅻ", "²³", "①②", "٣٤٥", "ＡＢＣ", "ｱｲｳ"]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "model", "token",
         "机器学习", "人工智能", "数据", "こんにちは", "カタカナ", "Привет", "мир", "مرحبا", "안녕하세요", "naïve",
         "café", "Straße", "ĲSSEL", "İstanbul", "DŽ", "ꙮ", "ᏣᎳᎩ"]


def random_text(rng):
    kind = rng.random()
    if kind < 0.35:  # prose-like
        parts = []
        for _ in range(rng.randint(1, 60)):
            r = rng.random()
            if r < 0.6:
                parts.append(rng.choice(WORDS))
            elif r < 0.8:
                parts.append(rng.choice(FRAGMENTS))
            else:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
            parts.append(rng.choice([" ", " ", " ", ", ", ". ", "\n", "", "  ", "\t"]))
        return "".join(parts)
    if kind < 0.75:  # script soup
        out = []
        for _ in range(rng.randint(0, 40)):
            if rng.random() < 0.3:
                out.append(rng.choice(FRAGMENTS))
            else:
                lo, hi = rng.choice(RANGES)
                out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12))))
        return "".join(out)
    if kind < 0.9:  # arbitrary code points (Unicode-version differences show up here)
        out = []
        for _ in range(rng.randint(1, 50)):
            cp = rng.randint(0x20, 0x3FFFF)
            if 0xD800 <= cp <= 0xDFFF:
                continue
            out.append(chr(cp))
        return "".join(out)
    # long runs that exercise the 25,000 cut and long-piece BPE
    unit = rng.choice([" ", "x", "ab", "中", "é", "\n", "!?", "1", "a b"])
    return rng.choice(["", "pre "]) + unit * rng.randint(1000, 30000) + rng.choice(["", " post"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/klinear")
    ap.add_argument("--tokenizer", default="tokenizers/kimi-k2")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    if not os.access(args.cli, os.X_OK):
        print(f"tokenizer_crosscheck.py: {args.cli} is not an executable; build the klinear CLI or pass --cli")
        return 1
    seed = args.seed if args.seed is not None else random.randrange(2 ** 32)
    rng = random.Random(seed)
    enc = load_encoding(args.tokenizer)
    print(f"seed {seed}; {args.count} texts; reference: tiktoken, offline, Kimi pattern and cuts")

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text.txt")
        for i in range(args.count):
            text = random_text(rng)
            allow_special = i % 2 == 1
            want = reference_encode(enc, text, allow_special)
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            cmd = [args.cli, "tokenize", "--tokenizer", args.tokenizer, "--file", path]
            if allow_special:
                cmd.append("--allow-special")
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"case {i}: klinear failed: {run.stderr.strip()}")
                failures += 1
                continue
            got = json.loads(run.stdout)
            if got != want:
                failures += 1
                k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                print(f"case {i} (allow_special={allow_special}): MISMATCH at id {k}: text {text[:200]!r}")
                print(f"  ours     {got[max(0, k - 3):k + 5]} -> {[enc.decode_single_token_bytes(t) for t in got[k:k + 3]]}")
                print(f"  tiktoken {want[max(0, k - 3):k + 5]} -> {[enc.decode_single_token_bytes(t) for t in want[k:k + 3]]}")
    print(f"{args.count - failures} of {args.count} texts agree with tiktoken")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
