"""A deterministic, varied test corpus for tokenizer tests (importable by any test).

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # from a test in tests/
    from corpus import build_corpus, dictionary_text
    docs = build_corpus(total_bytes=2_000_000, seed=0, special_strings=["<|endoftext|>"])

What it holds (every run with the same arguments gives the same list of str):
  * real text cut from the Debian dictionaries installed by scripts/install-deps.sh (gzip-read
    .dict.dz files): English (gcide, foldoc), German, French, Japanese, Russian, Arabic, Hindi and
    Greek, in documents of a few bytes to a few kilobytes, cut at arbitrary character positions;
  * generated Unicode edge cases: CJK and Hangul, combining marks and NFC/NFD/NFKC-sensitive
    characters, emoji ZWJ sequences, skin tones, flags and keycaps, whitespace runs of every kind
    (spaces, tabs, U+00A0, U+3000, \\r\\n, U+2028, U+0085...), contractions in any case ('S 'LL
    'Re), digit runs in several scripts, casing traps (İ, ſ, ǅ), code, URLs;
  * the given special-token strings embedded in text, alone, repeated, and cut short;
  * the empty string, single characters, and very long words (thousands of characters);
  * random mixtures of characters drawn from many scripts and categories.

Every dictionary must be installed (scripts/install-deps.sh installs them): a missing one raises
FileNotFoundError naming its package, so that a broken setup fails rather than testing a smaller,
different corpus.
"""

import gzip
import json
import random
from pathlib import Path

DICT_DIR = Path("/usr/share/dictd")

# (file stem, language/script tag)
DICTIONARIES = [
    ("gcide", "en"),
    ("foldoc", "en-computing"),
    ("freedict-deu-eng", "de"),
    ("freedict-fra-eng", "fr"),
    ("freedict-jpn-eng", "ja"),
    ("freedict-eng-rus", "ru"),
    ("freedict-ara-eng", "ar"),
    ("freedict-eng-hin", "hi"),
    ("freedict-ell-eng", "el"),
]

def write_gcide_jsonl(path, max_chars, doc_chars=None):
    """GCIDE's first max_chars characters (text-mode read, invalid bytes replaced) written to path
    as JSONL {"text": ...} documents, one per non-empty blank-line-separated entry (stripped, and
    cut to doc_chars characters when given): the small training corpus of the CLI tests."""
    with gzip.open(DICT_DIR / "gcide.dict.dz", "rt", errors="replace") as f:
        raw = f.read(max_chars)
    with open(path, "w") as out:
        for b in raw.split("\n\n"):
            b = b.strip()
            if b:
                out.write(json.dumps({"text": b[:doc_chars]}) + "\n")


_text_cache = {}


def dictionary_text(stem, max_bytes=None):
    """The decompressed text of /usr/share/dictd/<stem>.dict.dz (at most max_bytes bytes of it),
    decoded as UTF-8 with invalid bytes replaced by U+FFFD (gcide has a few Windows-1252 bytes).
    Raises FileNotFoundError when the dictionary is not installed."""
    key = (stem, max_bytes)
    if key not in _text_cache:
        path = DICT_DIR / f"{stem}.dict.dz"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: install the Debian package dict-{stem} "
                "(scripts/install-deps.sh does)")
        with gzip.open(path, "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes)
        _text_cache[key] = data.decode("utf-8", errors="replace")
    return _text_cache[key]


def _real_documents(rng, total_chars):
    """Documents cut from the dictionaries, about total_chars characters in all."""
    # Skip each dictionary's header; read enough to draw many distinct slices.
    available = [dictionary_text(stem, 3_000_000)[2000:] for stem, _tag in DICTIONARIES]
    docs = []
    chars = 0
    while chars < total_chars:
        text = rng.choice(available)
        # Mostly short-to-medium documents, some long ones.
        length = int(rng.choice([rng.randint(1, 80), rng.randint(80, 1500), rng.randint(1500, 6000)]))
        start = rng.randrange(0, max(1, len(text) - length))
        doc = text[start:start + length]
        docs.append(doc)
        chars += len(doc)
    return docs


_EDGE_CASES = [
    "",
    " ",
    "\n",
    "a",
    "Hello world",
    # CJK, Hangul, kana
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "東京都渋谷区 ２０２４年１２月",
    "ｶﾀｶﾅ ｈａｌｆ／ｆｕｌｌ ＡＢＣ１２３",
    # combining marks and normalization-sensitive characters
    "e\u0301 \u00e9 a\u0308\u0301 o\u0328\u0304 \u1e9b\u0323",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u212b \u00c5 A\u030a \u2126 \u03a9 \ufb01 \ufb03 \u2460 \u00bd \u2075 \u3392",
    "\u1100\u1161\u11a8 \uac01 \u0915\u094d\u0937 \u0e01\u0e33",
    "\u0130stanbul \u0131 \u017f \u01c5 \u1e9e \u00df STRASSE stra\u00dfe",
    # emoji
    "\U0001F469\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family",
    "\U0001F44D\U0001F3FB\U0001F44D\U0001F3FC\U0001F44D\U0001F3FD\U0001F44D\U0001F3FE\U0001F44D\U0001F3FF",
    "\U0001F468\U0001F3FD\u200d\U0001F4BB coding \U0001F3F3\ufe0f\u200d\U0001F308 \U0001F1FA\U0001F1F8\U0001F1EB\U0001F1F7 1\ufe0f\u20e3 #\ufe0f\u20e3",
    "I love \U0001F355!!! \U0001F600\U0001F600\U0001F600",
    # whitespace of every kind
    "a  b   c    d     e",
    "\t\ttabs\tand\t \t mixed\t",
    "non\u00a0breaking\u00a0\u00a0spaces\u202fand\u2009thin",
    "ideographic\u3000space\u3000\u3000",
    "windows\r\nline\r\n\r\nendings\r\n",
    "\n\n\nmany\n\n\n\nnewlines\n\n",
    "line\u2028separator\u2029para\u0085nel\u180emongolian\u200bzero\u200cwidth\ufeffbom",
    "   leading and trailing   ",
    " \t \n \r\n \u00a0 \u3000 ",
    "\x0b\x0c\x1c\x1d\x1e\x1f\x7f\x00 controls",
    # contractions in any case
    "I'm you're he's we've they'll I'd can't won't",
    "I'M YOU'RE HE'S WE'VE THEY'LL I'D CAN'T WON'T",
    "'S 'LL 'Re 'rE 'VE 'd 'M 'T 's'll're",
    "it\u2019s rock \u2019n\u2019 roll 'ſ 'Ś",
    # digits
    "1234567890 12 123 1234 12345 123456",
    "3.14159 1,000,000 -42 +7 1e10 0x1F 1/2",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \u00b2\u00b3 \u216b \uff11\uff12 \U0001D7D8",
    "9" * 257,
    # code and markup
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "{\"key\": [1, 2, {\"a\": null}], 'b': true}",
    "<html><body class=\"x\">Hi &amp; bye</body></html>",
    "https://example.com/path/to?q=1&r=%20two#frag user@example.org",
    "C:\\Users\\name\\file.txt /usr/local/bin",
    "x+=1; y-=2; z*=3; a&&b||c; !!! ??? ... --- ___ ***",
    # long words
    "a" * 5000,
    "ab" * 3000,
    "\U0001F600" * 600,
    " " * 3000,
    "!" * 2000,
    "\u00e9" * 2500,
    "\u65e5" * 2000,
    "Donaudampfschifffahrtselektrizit\u00e4tenhauptbetriebswerkbauunterbeamtengesellschaft",
    "pneumonoultramicroscopicsilicovolcanoconiosis " * 20,
    # replacement character and private use
    "bad \ufffd byte \ue000 private \U000F0000",
]

# Ranges to draw random characters from: (first, last) code points, all assigned in Unicode 6.
_RANDOM_RANGES = [
    (0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E),  # ASCII, weighted
    (0x09, 0x0D), (0xA0, 0xFF), (0x100, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x5D0, 0x5EA), (0x621, 0x64A), (0x660, 0x669), (0x900, 0x97F), (0xE01, 0xE3A),
    (0x300, 0x36F), (0x1100, 0x1112), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x4FFF),
    (0xAC00, 0xAD00), (0x2000, 0x200F), (0x2010, 0x2027), (0x2070, 0x209C), (0x20A0, 0x20B9),
    (0x2190, 0x21FF), (0x2200, 0x22FF), (0x2460, 0x24FF), (0x3000, 0x3003), (0xFF01, 0xFF5E),
    (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F3FB, 0x1F3FF), (0x200D, 0x200D),
    (0xFE0F, 0xFE0F),
]


def _random_mix(rng, length):
    out = []
    for _ in range(length):
        lo, hi = rng.choice(_RANDOM_RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _special_documents(rng, special_strings, words):
    docs = []
    for s in special_strings:
        w = rng.choice(words)
        docs += [
            s,
            s + s,
            f"{w}{s}{w}",
            f"{w} {s} {w}",
            f"{s} {w}\n{s}\n",
            f"  {s}  ",
            f"{s[:-1]} {w}" if len(s) > 1 else w,
            f"x{s[1:]}" if len(s) > 1 else w,
            f"{w.upper()}{s}{s}{w}",
        ]
    if len(special_strings) >= 2:
        for _ in range(20):
            parts = [rng.choice(special_strings + words) for _ in range(rng.randint(2, 8))]
            docs.append(rng.choice(["", " ", "\n"]).join(parts))
    return docs


def build_corpus(total_bytes=2_000_000, seed=0, special_strings=()):
    """The corpus as a list of documents (str), about total_bytes of UTF-8 in all. Deterministic
    for given arguments. special_strings: texts of special tokens to embed (e.g. a tokenizer's
    added tokens)."""
    rng = random.Random(seed)
    special_strings = list(special_strings)
    words = ["hello", "Hello", "world", "the", "THE", "token", "Bonjour", "Straße", "日本",
             "мир", "123", "!", "\u2581", "\u0120", "don't"]
    docs = list(_EDGE_CASES)
    docs += _special_documents(rng, special_strings, words)
    for _ in range(300):
        docs.append(_random_mix(rng, rng.randint(1, 200)))
    # Mixtures of real text and edge cases.
    real = _real_documents(rng, max(1, total_bytes // 2))
    for _ in range(len(real) // 10):
        a, b = rng.choice(real), rng.choice(_EDGE_CASES + words + special_strings)
        docs.append(a[: rng.randint(0, len(a))] + b + a[rng.randint(0, len(a)):])
    docs += real
    rng.shuffle(docs)
    return docs
