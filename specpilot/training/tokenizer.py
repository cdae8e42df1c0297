"""A byte-level BPE tokenizer trained with `tokenizers`, saved in Hugging Face format.

Special tokens come first: id 0 `<|endoftext|>` (EOS and document separator) and id 1 `<|mask|>` (the DFlash
drafter's mask token; the target never sees it). `AutoTokenizer.from_pretrained(folder)` loads the result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

EOS = "<|endoftext|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (EOS, MASK)
EOS_ID, MASK_ID = 0, 1


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int):
    """A `tokenizers.Tokenizer` with byte-level BPE merges learnt from `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS) == EOS_ID and tok.token_to_id(MASK) == MASK_ID
    return tok


def save_tokenizer(tok, folder: str | Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json (+ special_tokens_map.json) that AutoTokenizer reads."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        mask_token=MASK,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(folder))


def load_tokenizer(folder: str | Path):
    """The raw `tokenizers.Tokenizer` of a saved folder (fast batch encoding, no transformers import)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))


def encode_all(tok, texts: list[str]) -> list[list[int]]:
    """Corpus text to ids; a special token's text inside a document (`"<|endoftext|>"` in tokenizer code) is plain
    text, so EOS separates documents only where `token_stream` puts it and the target never sees the mask id."""
    before = tok.encode_special_tokens
    tok.encode_special_tokens = True
    try:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    finally:
        tok.encode_special_tokens = before
