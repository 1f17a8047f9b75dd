"""A word-level tokenizer built from code for the tiny vision-language models of these tests (no download)."""

from __future__ import annotations

from collections.abc import Sequence

WORDS = (
    "a an the is are of in on and with what who where how many this that there it picture image photo "
    "cat dog bird car tree house sky sun red blue green white black small big left right top bottom "
    "describe answer question user assistant USER ASSISTANT : ? . , yes no one two three"
).split()


def word_tokenizer(specials: Sequence[str], *, pad: str = "<pad>", bos: str = "<s>", eos: str = "</s>", unk: str = "<unk>", **extra: str):
    """A fast tokenizer over :data:`WORDS` with the given special tokens (ids 0.. in the order pad, bos, eos, unk, specials).

    Returns a transformers ``PreTrainedTokenizerFast``; ``extra`` names more attributes (``image_token="<image>"``).
    """
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    special = [pad, bos, eos, unk, *specials]
    vocab = {token: index for index, token in enumerate(special + [w for w in WORDS if w not in special])}
    core = Tokenizer(WordLevel(vocab, unk_token=unk))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk,
        additional_special_tokens=list(specials),
    )
    for name, value in extra.items():
        setattr(tokenizer, name, value)
    return tokenizer
