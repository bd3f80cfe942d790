"""Tokenizer, packed token streams and resumable batches for every training recipe.

The corpora themselves (stdlib, python, local files, hub datasets) and their train / held-out split live in
draftkit.corpus, which eval/ reads too; they are re-exported here.
"""
from __future__ import annotations

import hashlib
import os

import torch

from draftkit.files import write_atomically
from draftkit.corpus import (HELDOUT_PERCENT, PROSE_FILE, Corpus, CorpusError, build_corpus, build_local_corpus,  # noqa: F401
                             is_heldout, python_files, stdlib_files)


def train_tokenizer(texts, vocab_size: int = 8192, save_dir: str | None = None):
    """Byte-level BPE trained on `texts`, wrapped as a Hugging Face fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if save_dir:
        tok.save_pretrained(save_dir)
    return tok


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's vocabulary and rules (keys the token caches: two tokenizers of one size differ)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def pack_tokens(texts, tokenizer, cache_path: str | None = None, chunk: int = 256) -> torch.Tensor:
    """All texts tokenized and joined with EOS into one 1-D int32 stream (cached on disk)."""
    if cache_path and os.path.exists(cache_path):
        return torch.load(cache_path)
    from tqdm import tqdm

    eos = tokenizer.eos_token_id
    texts = list(texts)
    ids: list[int] = []
    bar = tqdm(total=len(texts), desc="tokenizing", unit=" documents", delay=2, leave=False)  # shown past 2 s
    for i in range(0, len(texts), chunk):  # batches: the Rust tokenizer encodes them in parallel
        for row in tokenizer(texts[i:i + chunk])["input_ids"]:
            ids.extend(row)
            ids.append(eos)
        bar.update(len(texts[i:i + chunk]))
    bar.close()
    stream = torch.tensor(ids, dtype=torch.int32)
    if cache_path:
        write_atomically(cache_path, lambda scratch: torch.save(stream, scratch))  # runs may share the cache
    return stream


def token_streams(cfg, corpus: Corpus, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed (train, held-out) streams, cached under cfg.cache_dir per corpus and tokenizer fingerprint."""
    cache_dir = getattr(cfg, "cache_dir", "")
    key = f"{corpus.fingerprint[:16]}-{tokenizer_fingerprint(tokenizer)}"
    cache = os.path.join(cache_dir, f"tokens-{key}") if cache_dir else None
    train = pack_tokens(corpus.train["text"], tokenizer, cache and cache + "-train.pt")
    heldout = pack_tokens(corpus.heldout["text"], tokenizer, cache and cache + "-heldout.pt")
    seq_len = getattr(cfg, "seq_len", 0)
    short = [f"{n:,} {part} tokens" for n, part in ((train.numel(), "train"), (heldout.numel(), "held-out"))
             if n <= seq_len]
    if short:  # found now, not after the training steps when the final evaluation needs a held-out block
        raise CorpusError(f"corpus {corpus.source}: {' and '.join(short)}, less than one block of --seq_len "
                          f"{seq_len}; give a larger corpus (its held-out part is a fixed share of its documents) "
                          f"or a smaller --seq_len")
    return train, heldout


def load_streams(cfg, tokenizer, acc) -> tuple[Corpus, torch.Tensor, torch.Tensor]:
    """(corpus, train stream, held-out stream); the main process fills the caches, the others read them."""
    with acc.main_process_first():
        corpus = build_corpus(cfg.corpus, cfg.text_column)
        train, heldout = token_streams(cfg, corpus, tokenizer)
    acc.print(f"corpus {corpus.source}: {train.numel():,} train / {heldout.numel():,} held-out tokens")
    return corpus, train, heldout


class BlockSampler:
    """Random fixed-length windows of a token stream, resumable by step.

    The window for (step, row) depends only on the seed and the step, so a
    resumed run draws exactly the batches the interrupted one would have.
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int = 0):
        if stream.numel() <= seq_len + 1:
            raise ValueError(f"corpus has {stream.numel()} tokens, fewer than one block of {seq_len + 1}")
        self.stream, self.seq_len, self.batch_size, self.seed = stream, seq_len, batch_size, seed

    def batch(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.stream.numel() - self.seq_len, (self.batch_size,), generator=gen)
        rows = [self.stream[s: s + self.seq_len] for s in starts.tolist()]
        return torch.stack(rows).long()  # (B, T)


def heldout_batches(stream: torch.Tensor, seq_len: int, blocks: int, device=None, batch_size: int = 8):
    """The first `blocks` consecutive held-out blocks, in (B, T) batches: every recipe's evaluation data."""
    n = min(blocks, (stream.numel() - 1) // seq_len)
    if n < 1:
        raise ValueError(f"held-out stream of {stream.numel()} tokens holds no block of {seq_len}")
    for i in range(0, n, batch_size):
        rows = [stream[j * seq_len:(j + 1) * seq_len] for j in range(i, min(n, i + batch_size))]
        yield torch.stack(rows).long().to(device)
