#!/usr/bin/env python3
"""Reference data for tests/tokenizer_test.cpp: trains a small GPT-2-style byte-level BPE with
Hugging Face `tokenizers` (pip install tokenizers; not needed to build or test Sinter) and writes
tests/data/bpe/tokenizer.json and reference.json (strings, their ids, and the decoded text).

    python3 scripts/bpe_reference.py"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "bpe")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 12:45, isn't it? We'll see; they've gone.",
    "Pack my box with five dozen liquor jugs!  Sphinx of black quartz, judge my vow.\n\tTabs and  spaces.",
    "Ünïcödé létters: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어.",
    "Numbers 3.14159 and 2,718 and ١٢٣ and ² and Ⅻ; emoji 🙂👍 and symbols © ™ → ∑.",
] * 40 + ["line %d: the value is %d and the word is w%dx" % (i, i * 7919 % 1000, i) for i in range(300)]

CASES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It's isn't we'll they've I'm you'd she's THEY'RE",
    "   leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n  \n end",
    "numbers 12345 678.90 1,000,000 and 3x4",
    "Ünïcödé: naïve café Straße Ελληνικά русский 日本語 한국어",
    "digits ١٢٣ ² Ⅻ ½ mixed a1b2",
    "emoji 🙂👍 symbols © ™ → ∑ !!! ??? ...",
    "<|endoftext|>after the special token<|endoftext|>",
    "line 42: the value is 798 and the word is w42x",
    "",
    " ",
    "a",
]


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    cases = []
    for text in CASES:
        ids = tok.encode(text).ids
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump({"vocab_size": tok.get_vocab_size(), "cases": cases}, f, ensure_ascii=False, indent=1)
    print("wrote", OUT, "vocab", tok.get_vocab_size())


if __name__ == "__main__":
    main()
