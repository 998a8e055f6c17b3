"""Offline, deterministic tokenization for the sim: a real tokenizer.json when given, else a stable scheme."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Protocol

# ChatML control tokens: the fallback maps each to one fixed id, like a real tokenizer's added tokens.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
FALLBACK_VOCAB_SIZE = 49152  # SmolLM2's vocabulary size, so ids look plausible

# Words, with their leading space, punctuation runs and whitespace runs, roughly what a BPE's pre-tokenizer
# splits; long words are cut into 6-character pieces so token counts grow with length as they do in BPE.
_PIECE = re.compile(
    r"<\|[a-z_]+\|>|[ ]?[A-Za-z]{1,6}|[ ]?[0-9]{1,3}|[ ]?[^\sA-Za-z0-9]|\s+"
)

# Words the fallback generates as output; single-token in SmolLM2's BPE, so a real tokenizer agrees on count.
_OUTPUT_WORDS = (  # noqa: SIM905
    " the of and to in is that for it as with was on be by this are from at or an have not"
    " but can all which one will has more their when if so about there what some would into"
    " than them time only other new could these two may first then do any like my now over"
    " such our man me even most made after also did many before must through back years where"
    " much your way well down should because each just those people how too little state good"
    " very make world still own see men work long get here between both life being under never"
    " day same another know while last might us great old year off come since against go came"
    " right used take three"
).split()


class Tokenizer(Protocol):
    """What the sim needs from a tokenizer."""

    eos_token_id: int

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`, special tokens recognised; BOS etc. only with add_special_tokens."""
        ...

    def output_vocab(self) -> list[tuple[int, str]]:
        """(token id, text) pairs the sim samples output from; each id decodes to its text alone."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens kept and unknown ids dropped (as vLLM's /detokenize)."""
        ...

    def id_to_token(self, tid: int) -> str | None:
        """The vocabulary string of one id (vLLM's convert_ids_to_tokens), None for an unknown id."""
        ...


class FallbackTokenizer:
    """A stable scheme: regex pieces, id = crc32(piece) folded into the vocabulary; identical in every process."""

    def __init__(self) -> None:
        self._special = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
        self.eos_token_id = self._special["<|im_end|>"]
        self._cache: dict[str, int] = {}
        # id -> piece for decoding: the specials, output words and every piece encoded so far (bounded like
        # _cache); a crc32 id is not invertible, so ids never produced here cannot be decoded.
        self._pieces: dict[int, str] = {i: tok for tok, i in self._special.items()}
        self.output_vocab()  # output words decode before anything was encoded

    def _piece_id(self, piece: str) -> int:
        tid = self._cache.get(piece)
        if tid is None:
            tid = self._special.get(piece)
            if tid is None:
                tid = len(SPECIAL_TOKENS) + zlib.crc32(piece.encode()) % (FALLBACK_VOCAB_SIZE - len(SPECIAL_TOKENS))
            if len(self._cache) < 200_000:
                self._cache[piece] = tid
                self._pieces.setdefault(tid, piece)
        return tid

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` (the scheme has no BOS, so add_special_tokens changes nothing)."""
        piece_id = self._piece_id
        return [piece_id(p) for p in _PIECE.findall(text)]

    def id_to_token(self, tid: int) -> str | None:
        """The piece an id was produced from (None if this process never produced it)."""
        return self._pieces.get(tid)

    def decode(self, ids: list[int]) -> str:
        """Concatenated pieces."""
        pieces = self._pieces
        return "".join(pieces.get(t, "") for t in ids)

    def output_vocab(self) -> list[tuple[int, str]]:
        """The output words that are one piece under this scheme, with their ids (as HFTokenizer keeps the words
        that are one token): generated text then tokenizes back to the ids that produced it."""
        return [(self._piece_id(" " + w), " " + w) for w in _OUTPUT_WORDS if len(_PIECE.findall(" " + w)) == 1]


class HFTokenizer:
    """A real tokenizer.json read with the `tokenizers` package (offline)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as _Tok

        path = Path(path).expanduser()
        self._tok = _Tok.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
        eos = self._tok.token_to_id("<|im_end|>")
        if eos is None:
            eos = self._tok.token_to_id("<|endoftext|>")
        self.eos_token_id = int(eos) if eos is not None else 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` as the model's tokenizer splits it (no BOS unless asked, like vLLM's chat path)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def id_to_token(self, tid: int) -> str | None:
        """The vocabulary entry (byte-level BPE shows a leading space as Ġ, as vLLM's token_strs do)."""
        tok = self._tok.id_to_token(tid)
        return None if tok is None else str(tok)

    def decode(self, ids: list[int]) -> str:
        """Text of ids with special tokens kept."""
        size = self._tok.get_vocab_size(with_added_tokens=True)
        return str(self._tok.decode([t for t in ids if t < size], skip_special_tokens=False))

    def output_vocab(self) -> list[tuple[int, str]]:
        """Output words that are one token in this vocabulary and decode to themselves."""
        vocab: list[tuple[int, str]] = []
        for w in _OUTPUT_WORDS:
            ids = self._tok.encode(" " + w, add_special_tokens=False).ids
            if len(ids) == 1:
                vocab.append((int(ids[0]), self._tok.decode(ids)))
        return vocab or [(int(self._tok.encode(" the", add_special_tokens=False).ids[0]), " the")]


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The real tokenizer at `path` (a tokenizer.json, or a model folder holding one), else the fallback scheme."""
    if path:
        return HFTokenizer(path)
    return FallbackTokenizer()
