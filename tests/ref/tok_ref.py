#!/usr/bin/python3
"""tok_ref.py — makes tests/data/tok/: the reference files of test_tok_bpe
and test_tok_spm (the tests themselves need no Python).

Byte-level BPE: trains a small vocabulary (300 merges) on Debian's fortunes
text, writes it as GPT-2 ships it (vocab.json + merges.txt) and as Hugging
Face's tokenizer.json (a plain ByteLevel one, and SmolLM's Sequence of
Digits(individual_digits) + ByteLevel with merges as pairs), and encodes the
test texts with OpenAI's encoder.py algorithm, written out below:
bytes_to_unicode, get_pairs, bpe() and encode() as encoder.py has them. The
pre-tokenizer regex
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
is run by hand (the `regex` module is not installed here): an alternation
tried in order at each position, \\p{L} / \\p{N} from unicodedata's
categories, \\s Unicode's White_Space (the `regex` module's and Oniguruma's
\\s). `<|endoftext|>` is split off before pre-tokenization, as Hugging
Face's tokenizers and GPT2Tokenizer do (encoder.py itself has no special
tokens).

SentencePiece: spm_train (Debian's sentencepiece) makes a BPE model of 1000
pieces on the fortunes text without byte fallback (so unknown characters
show), and python3-sentencepiece encodes and decodes the texts.

Usage: /usr/bin/python3 tests/ref/tok_ref.py   (from the repository root)
"""
import json
import os
import subprocess
import sys
import tempfile
import unicodedata

import sentencepiece as spm

FORTUNES = "/usr/share/games/fortunes/fortunes"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tok")
MERGES = 300
EOT = "<|endoftext|>"


# ---- encoder.py ----------------------------------------------------------------

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    cs = [chr(n) for n in cs]
    return dict(zip(bs, cs))


def get_pairs(word):
    pairs = set()
    prev_char = word[0]
    for char in word[1:]:
        pairs.add((prev_char, char))
        prev_char = char
    return pairs


WHITE_SPACE = set("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | \
    {chr(c) for c in range(0x2000, 0x200B)}


def is_s(c):
    return c in WHITE_SPACE


def is_l(c):
    return unicodedata.category(c)[0] == "L"


def is_n(c):
    return unicodedata.category(c)[0] == "N"


def is_other(c):
    return not is_s(c) and not is_l(c) and not is_n(c)


def findall(s):
    """re.findall(pat, s) for GPT-2's pattern, alternative by alternative."""
    out, i, n = [], 0, len(s)
    while i < n:
        end = None
        for c in ("s", "t", "re", "ve", "m", "ll", "d"):
            if s.startswith("'" + c, i):
                end = i + 1 + len(c)
                break
        if end is None:
            for cls in (is_l, is_n, is_other):  # ' ?X+'
                j = i + 1 if s[i] == " " else i
                if j < n and cls(s[j]):
                    while j < n and cls(s[j]):
                        j += 1
                    end = j
                    break
                # the optional space matched nothing: X+ at i itself
                if s[i] == " " and cls(s[i]):
                    j = i
                    while j < n and cls(s[j]):
                        j += 1
                    end = j
                    break
        if end is None and is_s(s[i]):
            j = i
            while j < n and is_s(s[j]):
                j += 1
            if j == n:
                end = j  # \s+(?!\S) at the end
            elif j - 1 > i:
                end = j - 1  # \s+ backs off one so that (?!\S) holds
            else:
                end = j  # \s+
        assert end is not None and end > i, (s, i)
        out.append(s[i:end])
        i = end
    return out


class Encoder:
    def __init__(self, encoder, bpe_merges, digits=False):
        self.encoder = encoder
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.cache = {}
        self.digits = digits

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            new_word = tuple(new_word)
            word = new_word
            if len(word) == 1:
                break
            else:
                pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def pieces(self, text):
        if not self.digits:
            return findall(text)
        # Hugging Face's Digits(individual_digits=True): every numeric
        # character alone, then the pattern inside each part
        parts, cur = [], ""
        for c in text:
            if is_n(c):
                if cur:
                    parts.append(cur)
                parts.append(c)
                cur = ""
            else:
                cur += c
        if cur:
            parts.append(cur)
        return [p for part in parts for p in findall(part)]

    def encode(self, text):
        bpe_tokens = []
        for k, seg in enumerate(text.split(EOT)):
            if k:
                bpe_tokens.append(self.encoder[EOT])
            for token in self.pieces(seg):
                token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
                bpe_tokens.extend(self.encoder[bpe_token] for bpe_token in self.bpe(token).split(" "))
        return bpe_tokens

    def decode(self, tokens):
        text = "".join([self.decoder[token] for token in tokens])
        return bytearray([self.byte_decoder[c] for c in text])


# ---- training a small vocabulary -----------------------------------------------

def train(text, merges):
    """Counts of the pieces' byte-symbol words; merge the most frequent pair
    (ties: the smallest pair) `merges` times."""
    be = bytes_to_unicode()
    words = {}
    for p in findall(text):
        w = tuple(be[b] for b in p.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    vocab = {c: i for i, c in enumerate(be.values())}
    out = []
    for _ in range(merges):
        counts = {}
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + c
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        out.append(best)
        if best[0] + best[1] not in vocab:
            vocab[best[0] + best[1]] = len(vocab)
        nw = {}
        for w, c in words.items():
            r, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    r.append(w[i] + w[i + 1])
                    i += 2
                else:
                    r.append(w[i])
                    i += 1
            nw[tuple(r)] = nw.get(tuple(r), 0) + c
        words = nw
    vocab[EOT] = len(vocab)
    return vocab, out


def tokenizer_json(vocab, merges, digits):
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    pre = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, bl]} \
        if digits else bl
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab[EOT], "content": EOT, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": pre,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab,
                  "merges": [[a, b] for a, b in merges] if digits else [a + " " + b for a, b in merges]},
    }


TEXTS = {
    "unicode": "Héllo wörld! Ünïcödé: ελληνικά, русский, 中文字符, 日本語のテキスト, 한국어, "
               "emoji 😀🎉👍🏽, combining e\u0301, مرحبا, ∑∫√ ≤ ≥, NBSP a\u00a0b, ideo\u3000space, "
               "NEL x\u0085y, em\u2003space, tab\tend ½ Ⅻ",
    "digits": "1 12 123 1234 3.14159 2,000,000 007 1st 2nd 3rd ½ ² ٣٤ 10e5 0x1F  42  99 bottles",
    "contractions": "I'm you're they've we'll she'd it's don't can't 'twas I'M DON'T y'all "
                    "o'clock ''quoted'' 's 'S 'll've rock'n'roll",
    "spaces": "a  b   c    d\t\te \n\n f  \n  g   \r\n h          end   \n   leading\ntrailing   ",
    "special": "Hello<|endoftext|>World <|endoftext|> x<|endoftext|><|endoftext|> <|endoftext",
    "punct": "Well... \"quoted\" (parens) [brackets] {braces} --dashes-- a+b=c; x<y>z @#$%^&*~`|\\/",
    "empty": "",
}


def write_cases(path, cases):
    with open(path, "wb") as f:
        for name, text, lists in cases:
            b = text.encode("utf-8")
            f.write(b"case %s\ntext %d\n" % (name.encode(), len(b)) + b + b"\n")
            for key, val in lists:
                if isinstance(val, (bytes, bytearray)):
                    f.write(b"%s %d\n" % (key.encode(), len(val)) + bytes(val) + b"\n")
                else:
                    f.write(b"%s %d\n" % (key.encode(), len(val)) +
                            " ".join(map(str, val)).encode() + b"\n")


def spm_args(prefix):
    return ["spm_train", "--input=" + FORTUNES, "--model_prefix=" + prefix, "--vocab_size=1000",
            "--model_type=bpe", "--character_coverage=1.0", "--byte_fallback=false",
            "--normalization_rule_name=identity", "--remove_extra_whitespaces=false",
            "--add_dummy_prefix=true", "--num_threads=1", "--minloglevel=2"]


def main():
    fortunes = open(FORTUNES, "rb").read().decode("utf-8")
    os.makedirs(os.path.join(OUT, "bpe"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "bpe_digits"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "spm"), exist_ok=True)
    vocab, merges = train(fortunes, MERGES)
    with open(os.path.join(OUT, "bpe", "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(OUT, "bpe", "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(a + " " + b + "\n" for a, b in merges))
    for d, digits in (("bpe", False), ("bpe_digits", True)):
        with open(os.path.join(OUT, d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_json(vocab, merges, digits), f, ensure_ascii=True)
    plain, dig = Encoder(vocab, merges), Encoder(vocab, merges, digits=True)
    cases = []
    for name, text in [("fortunes", fortunes)] + list(TEXTS.items()):
        a, b = plain.encode(text), dig.encode(text)
        assert plain.decode(a) == text.encode("utf-8") and dig.decode(b) == text.encode("utf-8")
        cases.append((name, text, [("ids", a), ("ids_digits", b)]))
    write_cases(os.path.join(OUT, "bpe_cases.txt"), cases)

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(spm_args("spm"), cwd=tmp, check=True)
        model = open(os.path.join(tmp, "spm.model"), "rb").read()
    with open(os.path.join(OUT, "spm", "tokenizer.model"), "wb") as f:
        f.write(model)
    with open(os.path.join(OUT, "spm_train_args.txt"), "w") as f:
        f.write(" ".join(spm_args("spm")) + "\n")
    sp = spm.SentencePieceProcessor(model_proto=model)
    cases = []
    for name, text in [("fortunes", fortunes)] + list(TEXTS.items()):
        ids = sp.encode(text)
        cases.append((name, text, [("ids", ids), ("decoded", sp.decode(ids).encode("utf-8"))]))
    write_cases(os.path.join(OUT, "spm_cases.txt"), cases)
    print("vocab %d, merges %d, spm pieces %d, bos %d eos %d unk %d" %
          (len(vocab), len(merges), sp.get_piece_size(), sp.bos_id(), sp.eos_id(), sp.unk_id()))


if __name__ == "__main__":
    sys.exit(main())
