"""A word-level tokenizer and a chat template built from code for the tiny vision-language families.

Nothing is downloaded: the vocabulary is a short word list plus each family's special tokens, wrapped in
``PreTrainedTokenizerFast`` so that the real processors accept it.
"""

from __future__ import annotations

WORDS = [
    *"user assistant model system describe the image picture what is this in a an of and there red blue green".split(),
    *"cat dog car tree sky house left right top bottom small big one two it shows".split(),
    *".,?:!",
]


def word_tokenizer(special, *, eos, pad, bos=None, newline=True, **extra):
    """A WordLevel tokenizer over ``WORDS`` and ``special`` (each special token kept whole).

    ``newline=True`` makes a line break a token of its own (the real tokenizers of these families
    emit one; the Idefics3 layout reads row breaks from it). ``extra`` goes to
    ``PreTrainedTokenizerFast`` (named special tokens such as ``extra_special_tokens``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", *WORDS]
    added = list(dict.fromkeys([*special, eos, pad] + ([bos] if bos else []) + (["\n"] if newline else [])))
    vocab = {w: i for i, w in enumerate(words + added)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    kwargs = {"unk_token": "[UNK]", "eos_token": eos, "pad_token": pad, **extra}
    if bos:
        kwargs["bos_token"] = bos
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    fast.add_special_tokens({"additional_special_tokens": added}, replace_extra_special_tokens=False)
    return fast


def chat_template(*, turn_start, turn_end, image, assistant, bos=""):
    """A Jinja chat template: ``{bos}`` then per message ``turn_start(role)`` text/images ``turn_end``.

    ``turn_start`` is a format string with ``{role}``; ``image`` the text an image part becomes;
    ``assistant`` what ``add_generation_prompt`` appends.
    """
    start = turn_start.replace("{role}", "{{ message['role'] }}")
    return (
        bos + "{% for message in messages %}" + start + "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}" + image + "{% elif "
        "part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}" + turn_end + "{% endfor %}"
        "{% if add_generation_prompt %}" + assistant + "{% endif %}"
    )
