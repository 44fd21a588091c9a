"""Incremental detokenizer: V4 token ids -> text, a step at a time.

The V4 tokenizer is byte-level BPE: every id stands for a fixed byte string, and a character
can be split across ids (an emoji is often 4 one-byte ids). Decoding a step is therefore

    ids --table--> bytes --incremental UTF-8 decoder--> complete characters
                                 |
                                 +-- holds an incomplete trailing character (at most 3 bytes)

which costs O(new ids) per step and never re-decodes earlier output. The text equals
``tokenizer.decode(all_ids)`` (special tokens skipped, invalid UTF-8 replaced by U+FFFD per
maximal invalid subsequence, as Rust's ``String::from_utf8_lossy`` does), because the byte
table reproduces the ByteLevel decoder and Python's decoder replaces the same subsequences.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Sequence

from tokenizers import Tokenizer

from dsi.tokenizer import load_tokenizer


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: the printable stand-in character of each byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_bytes(token: str, char_to_byte: dict[str, int]) -> bytes:
    # The ByteLevel decoder maps a token through the byte alphabet when every character is in
    # it, and otherwise keeps the token's own UTF-8 (added tokens such as "｜DSML｜").
    try:
        return bytes(char_to_byte[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


@functools.lru_cache(maxsize=4)
def byte_table(tokenizer: Tokenizer | None = None) -> tuple[bytes, ...]:
    """Bytes of every id, ``[vocab_size]``; special tokens (BOS, EOS, pad, ...) are ``b""``
    because decoding skips them. Built once per tokenizer."""
    tok = tokenizer or load_tokenizer()
    char_to_byte = _unicode_to_byte()
    size = tok.get_vocab_size(with_added_tokens=True)
    table = [b""] * size
    for token, i in tok.get_vocab(with_added_tokens=False).items():
        table[i] = _token_bytes(token, char_to_byte)
    for i, added in tok.get_added_tokens_decoder().items():
        table[i] = b"" if added.special else _token_bytes(added.content, char_to_byte)
    return tuple(table)


class IncrementalDetokenizer:
    """Turns token ids into text as they arrive, never splitting a UTF-8 character.

    >>> d = IncrementalDetokenizer()
    >>> d.feed(ids_of_first_half_of_emoji) + d.feed(ids_of_second_half)  # "" then "😀"
    """

    __slots__ = ("_decoder", "_table")

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self._table = byte_table(tokenizer)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (``b""`` for special or unknown ids)."""
        table = self._table
        return table[token_id] if 0 <= token_id < len(table) else b""

    def feed(self, token_ids: Sequence[int]) -> str:
        """Text completed by these ids; an incomplete trailing character stays pending."""
        table = self._table
        try:
            data = b"".join([table[i] for i in token_ids])
        except IndexError:
            data = b"".join([self.token_bytes(i) for i in token_ids])
        decoder = self._decoder
        if not decoder.buffer:  # nothing pending (most steps): whole characters decode directly
            try:
                return data.decode()
            except UnicodeDecodeError:  # a character cut at the end, or bad bytes: the decoder's way
                pass
        return decoder.decode(data)

    def flush(self) -> str:
        """Release pending bytes: an incomplete character becomes U+FFFD, as a full decode
        would render it where the output ends or an undecodable boundary follows."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending(self) -> bool:
        """Whether bytes of an incomplete character are held back."""
        return bool(self._decoder.getstate()[0])
