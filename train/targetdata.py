"""The one data path of every drafter recipe: rows of text, optionally continued by the target, and the frozen
target's outputs that a drafter trains on, computed once and stored.

    data = target_data(cfg, target, tokenizer, acc, layers=[2, 12, 21])
    b = data.batch(step)     # b.ids (B, T) long, b.loss_mask (B, T) bool, b.hidden {layer: (B, T, H)}, b.last (B, T, H)
    for b in data.heldout(blocks): ...

Rows (N, T = seq_len; made in train/target_rows.py), in one of two shapes:
- text: windows of the tokenized corpus (train/data.py). With `regenerate`, each window keeps its first
  regen_prompt_len tokens and the target writes the rest (greedy or sampled; temperatures alternate by shard),
  stopping at EOS: what the draft must predict at decoding time is the target's own text, not the corpus's.
- conversations (`messages_column`): each row a conversation rendered with the target's chat template, the loss
  on the assistant's tokens only. With `regenerate`, every assistant turn is rewritten by the target, in order,
  given the conversation so far (SpecForge's regenerate_train_data, vllm-project/speculators' prepare step).

loss_mask[t] is True where token t + 1 is trained on (a generated or assistant token): the position whose
target distribution (lm_head(last[t])) a drafter learns. Rows are written in shards of shard_rows rows under
cache_dir/rows-<key>/, each shard on its own (a killed run redoes at most one shard).

Target outputs: hidden_states[i] of each layer a recipe reads (0 = embeddings, L or -1 = the last, after the
final norm) and the last one. data_mode "cached" computes them once per shard and stores them (fp16, one file per
layer and shard under cache_dir/feats-<key>/, so recipes reading different layers share what they have in
common); every later epoch reads them instead of running the target. "online" runs the target on every batch
(no disk; the only choice when the target itself trains, Medusa-2).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass

import torch
from tqdm import tqdm

from draftkit.train.config import TrainConfig, TrainError, field
from draftkit.train.data import heldout_batches, load_streams
from draftkit.train.target_rows import RowStore, save_shard, writer_dtype

DATA_MODES = ("cached", "online")
REGEN_DTYPES = ("", "auto", "bfloat16", "float16", "float32")


@dataclass
class TargetDataConfig(TrainConfig):
    """Where a drafter's training rows come from and how the target's outputs reach it."""

    corpus: str = field("stdlib", "stdlib (the Python standard library), python (stdlib + draftkit's dependencies), "
                                  "a folder of .py files, a .txt/.json/.jsonl file or a hub dataset name; or several, "
                                  "comma-separated, read as one set of rows: each answered and stored on its own "
                                  "(adding one later reuses the others' stored rows), SOURCE:ROWS taking ROWS "
                                  "training rows from that one instead of train_rows")
    messages_column: str = field("", "a column of chat conversations (lists of {role, content}) rendered with the "
                                     "target's chat template, loss on assistant tokens only (empty: plain text "
                                     "from `corpus`)")
    regenerate: bool = field(False, "train on text the target wrote: the continuation of each corpus window, or "
                                    "every assistant turn of a conversation")
    train_rows: int = field(4096, "rows (seq_len tokens each) of training data taken from the corpus or conversations "
                                  "(rounded up to whole shards; raising it later keeps the shards already made)")
    regen_prompt_len: int = field(64, "text: corpus tokens that start each regenerated row")
    regen_max_new_tokens: int = field(0, "conversations: the longest answer the target writes per turn (0: up to "
                                         "seq_len); a batch runs until its longest answer ends, so a cap bounds it")
    heldout_rows: int = field(32, "conversations: held-out conversations the target answers (greedy) for the "
                                  "held-out metrics")
    regen_temperatures: list[float] = field([0.0, 0.8], "sampling temperatures of the regeneration, alternating "
                                                        "by shard (0: greedy)")
    regen_dtype: str = field("", "the precision the target writes its answers in: empty for its own; auto (bf16 for "
                                 "a float32 target where bf16 products run natively: a bf16 GPU, a CPU with "
                                 "AVX512-BF16 or AMX); or bfloat16 / float16 / float32. A copy of the target in that "
                                 "precision writes them; the hidden states and the held-out answers stay the "
                                 "target's own. SmolLM2-135M on 2 AMX cores wrote 2.3x faster in bf16 (batch 64)")
    shard_rows: int = field(128, "rows generated (and stored) together: one shard")
    data_seed: int = field(0, "seed of the corpus windows and of the regeneration's draws (rows are shared by every "
                               "recipe with the same data settings and target)")
    data_mode: str = field("cached", "cached: the target's outputs computed once, stored fp16 and reused every "
                                     "epoch; online: computed for every batch (no disk)")

    def corpus_sources(self) -> list[str]:
        return [source for source, _ in corpus_parts(self.corpus, self.train_rows)]

    def __post_init__(self):
        super().__post_init__()
        if self.data_mode not in DATA_MODES:
            raise TrainError(f"data_mode must be one of {', '.join(DATA_MODES)}, got {self.data_mode!r}")
        if self.train_rows < 1 or self.shard_rows < 1:
            raise TrainError("train_rows and shard_rows must be >= 1")
        if self.regenerate and not self.messages_column and not 0 < self.regen_prompt_len < self.seq_len:
            raise TrainError(f"regen_prompt_len ({self.regen_prompt_len}) must lie in (0, seq_len={self.seq_len})")
        if self.regen_dtype not in REGEN_DTYPES:
            raise TrainError(f"regen_dtype must be empty or one of {', '.join(REGEN_DTYPES[1:])}, "
                             f"got {self.regen_dtype!r}")
        if any(t < 0 for t in self.regen_temperatures) or not self.regen_temperatures:
            raise TrainError(f"regen_temperatures must be >= 0 and not empty, got {self.regen_temperatures}")


@dataclass
class TargetBatch:
    ids: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) bool: token t + 1 is trained on
    hidden: dict  # layer -> (B, T, H) float
    last: torch.Tensor  # (B, T, H) float: the target's final hidden state, logits = lm_head(last)
    top: torch.Tensor | None = None  # (B, T) long argmax of lm_head(last), stored with cached features (else None)


def corpus_parts(spec: str, train_rows: int) -> list[tuple[str, int]]:
    """[(source, training rows)] of a `corpus` setting: "a.jsonl,b.jsonl:960" -> [(a.jsonl, train_rows),
    (b.jsonl, 960)]. A ROWS suffix is digits after the last colon, so a source's own colons are left alone."""
    parts = []
    for item in (i.strip() for i in spec.split(",")):
        source, colon, rows = item.rpartition(":")
        if not colon or not rows.isdigit():
            source, rows = item, str(train_rows)
        if not source or int(rows) < 1:
            raise TrainError(f"--corpus {spec}: {item!r} is not SOURCE or SOURCE:ROWS with ROWS >= 1")
        parts.append((source, int(rows)))
    if len({source for source, _ in parts}) < len(parts):
        raise TrainError(f"--corpus {spec}: a source is named twice")
    return parts


def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def target_fingerprint(target) -> str:
    """A hash of the target's weights and config (keys the row and feature caches)."""
    h = hashlib.sha256(json.dumps(target.config.to_dict(), sort_keys=True, default=str).encode())
    for name, p in sorted(target.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def normalize_layers(layers, num_layers: int) -> list[int]:
    """hidden_states indices in [0, L], sorted, with the last (L, after the final norm) always listed last."""
    out = set()
    for i in layers:
        j = i + num_layers + 1 if i < 0 else i
        if not 0 <= j <= num_layers:
            raise TrainError(f"hidden state index {i} is outside 0..{num_layers} (or -{num_layers + 1}..-1)")
        out.add(j)
    return sorted(out - {num_layers}) + [num_layers]


@torch.no_grad()
def target_outputs(target, ids: torch.Tensor, layers: list[int], chunk: int = 16) -> dict[int, torch.Tensor]:
    """{layer: (B, T, H) float32} of one target forward per chunk of rows."""
    outs: dict[int, list[torch.Tensor]] = {i: [] for i in layers}
    for r in range(0, ids.shape[0], chunk):
        hs = target(input_ids=ids[r:r + chunk].to(target.device), output_hidden_states=True).hidden_states
        for i in layers:
            outs[i].append(hs[i].float())
    return {i: torch.cat(v) for i, v in outs.items()}


class TargetData:
    """Batches of rows with the target's outputs; epochs over the rows in a seeded order, resumable by step."""

    def __init__(self, cfg, target, rows: torch.Tensor, mask: torch.Tensor, layers: list[int], heldout,
                 feature_dirs: list[tuple[str, int]] | None, acc, seed: int):
        """heldout: a token stream (text: blocks of it) or (ids, mask) rows (conversations). feature_dirs: (folder,
        rows) of each corpus in the order of `rows`, where its target outputs are stored; None: no cache_dir."""
        self.cfg, self.target, self.rows, self.mask, self.layers = cfg, target, rows, mask, layers
        self.heldout_stream = heldout if isinstance(heldout, torch.Tensor) else None
        self.heldout_rows = None if isinstance(heldout, torch.Tensor) else heldout
        self.acc, self.seed = acc, seed
        self.last_layer = layers[-1]
        self.features = None
        self.top = None  # (N, T) int32 top-1 of p, with cached features
        if cfg.data_mode == "cached":  # stored under feature_dir, or (no cache_dir) kept in memory only
            self.features = self._load_features(feature_dirs) if feature_dirs else self._compute_features()

    @property
    def tokens_per_epoch(self) -> int:
        return int(self.mask.sum())

    def _load_features(self, folders: list[tuple[str, int]]) -> dict[int, torch.Tensor]:
        """Every corpus's stored outputs, in row order: folders[i] = (folder, rows of corpus i). Returns
        {layer: (N, T, H) fp16}, kept in memory, and sets self.top (N, T)."""
        parts, tops, first = [], [], 0
        for folder, n in folders:
            feats = self._load_corpus_features(folder, self.rows[first:first + n])
            tops.append(self._load_top(folder, feats[self.last_layer]))
            parts.append(feats)
            first += n
        self.top = torch.cat(tops)
        return {layer: torch.cat([p[layer] for p in parts]) for layer in self.layers}

    def _load_corpus_features(self, folder: str, rows: torch.Tensor) -> dict[int, torch.Tensor]:
        """Every (layer, shard) file of one corpus's rows (N, T) (whole shards), computing the missing ones (one
        target forward per shard for all of its missing layers). Returns {layer: (N, T, H) fp16}."""
        size = self.cfg.shard_rows
        shards = (rows.shape[0] + size - 1) // size

        def path(layer, s):
            return os.path.join(folder, f"L{layer}", f"{s:05d}.pt")

        for layer in self.layers:
            os.makedirs(os.path.join(folder, f"L{layer}"), exist_ok=True)
        todo = [s for s in range(shards) if any(not os.path.exists(path(layer, s)) for layer in self.layers)]
        with self.acc.main_process_first():
            for s in tqdm(todo, desc=f"target features ({len(todo)}/{shards} shards)",
                          disable=not self.acc.is_local_main_process):
                missing = [layer for layer in self.layers if not os.path.exists(path(layer, s))]
                outs = target_outputs(self.target, rows[s * size:(s + 1) * size].long(), missing)
                for layer in missing:
                    save_shard(outs[layer].half().cpu(), path(layer, s))
        return {layer: torch.cat([torch.load(path(layer, s)) for s in range(shards)]) for layer in self.layers}

    def _load_top(self, folder: str, last: torch.Tensor) -> torch.Tensor:
        """(N, T) int32 of one corpus's rows: the target's top-1 token at every position (argmax of lm_head over the stored final hidden
        state), stored per shard beside the features. A recipe with a reduced draft vocabulary needs it at every
        step to know whether p's top-1 lies in that vocabulary; over the full vocabulary of a real model (49k
        tokens) it costs more than the rest of a draft's training step."""
        os.makedirs(os.path.join(folder, "top"), exist_ok=True)
        size, head = self.cfg.shard_rows, self.target.get_output_embeddings()
        shards, parts = (last.shape[0] + size - 1) // size, []
        for s in range(shards):
            file = os.path.join(folder, "top", f"{s:05d}.pt")
            if not os.path.exists(file):
                with torch.no_grad():
                    rows = last[s * size:(s + 1) * size]
                    top = torch.cat([head(r.to(self.acc.device, head.weight.dtype)).argmax(-1).cpu()
                                     for r in rows.split(8)]).to(torch.int32)
                save_shard(top, file)
            parts.append(torch.load(file))
        return torch.cat(parts)

    def _compute_features(self) -> dict[int, torch.Tensor]:
        outs = target_outputs(self.target, self.rows.long(), self.layers)
        return {layer: h.half().cpu() for layer, h in outs.items()}

    def indices(self, step: int) -> torch.Tensor:
        """(B,) row indices of this rank's part of micro-batch `step`: epoch e visits every row once in a permutation
        seeded by e (the same on every rank); the global micro-batch is B x ranks consecutive rows of it and rank r
        reads the r-th B of them, so ranks read disjoint rows and N ranks of B see what one process of N x B does."""
        b, n = self.cfg.batch_size, self.rows.shape[0]
        first = (step * self.acc.num_processes + self.acc.process_index) * b
        epoch, offset = divmod(first, n)
        out = []
        while len(out) < b:
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
            out.extend(perm[offset:offset + b - len(out)].tolist())
            epoch, offset = epoch + 1, 0
        return torch.tensor(out)

    def width(self, idx: torch.Tensor, beyond: int = 0) -> int:
        """Columns micro-batch `idx` needs: through the token after its last trained position, and `beyond` more
        (a recipe whose positions predict several tokens ahead: DFlash's blocks).
        Conversations are right-padded to seq_len and a causal model's outputs before the padding do not depend
        on it, so the padding past that column is cut: about 40% of a chat batch's compute (answers of 60-224
        tokens in rows of 448)."""
        trained = self.mask[idx].any(0).nonzero()
        need = int(trained.max()) + 2 if trained.numel() else 1
        return min(self.rows.shape[1], need + beyond)

    def tokens(self, step: int, idx: torch.Tensor | None = None,
               beyond: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (B, T) long, loss_mask (B, T) bool) of micro-batch `step` (its rows `idx` when known), on the
        device, without target outputs (for recipes that run the target themselves: Medusa-2 fine-tunes it);
        T = width(idx, beyond)."""
        idx = self.indices(step) if idx is None else idx
        t = self.width(idx, beyond)
        return self.rows[idx, :t].long().to(self.acc.device), self.mask[idx, :t].to(self.acc.device)

    def batch(self, step: int, beyond: int = 0) -> TargetBatch:
        """Micro-batch `step` with the target's outputs (stored, or computed now), T = width(rows, beyond)."""
        idx = self.indices(step)
        ids, mask = self.tokens(step, idx, beyond)
        t = ids.shape[1]
        if self.features is None:
            hidden = target_outputs(self.target, ids, self.layers)
        else:
            hidden = {layer: f[idx, :t].to(self.acc.device).float() for layer, f in self.features.items()}
        top = self.top[idx, :t].long().to(self.acc.device) if self.top is not None else None
        return TargetBatch(ids, mask, hidden, hidden[self.last_layer], top)

    def heldout_tokens(self, blocks: int):
        """(ids, loss_mask) batches of held-out rows: corpus blocks (every position trained on), or conversations."""
        if self.heldout_rows is None:
            for ids in heldout_batches(self.heldout_stream, self.cfg.seq_len, blocks, self.acc.device):
                mask = torch.ones_like(ids, dtype=torch.bool)
                mask[:, -1] = False
                yield ids, mask
            return
        ids, mask = self.heldout_rows
        for i in range(0, min(blocks, ids.shape[0]), 8):
            yield ids[i:i + 8].long().to(self.acc.device), mask[i:i + 8].to(self.acc.device)

    def heldout(self, blocks: int):
        """Held-out rows with the target's outputs computed fresh."""
        for ids, mask in self.heldout_tokens(blocks):
            hidden = target_outputs(self.target, ids, self.layers)
            yield TargetBatch(ids, mask, hidden, hidden[self.last_layer])


@dataclass
class CorpusRows:
    """One corpus's part of the training data."""

    corpus: object  # draftkit.corpus.Corpus
    rows: torch.Tensor  # (N, T) whole shards
    mask: torch.Tensor  # (N, T) bool
    heldout: object  # a token stream (text) or (ids, mask) rows (conversations)
    feature_dir: str | None  # where its target outputs are stored (None: no cache_dir)


def corpus_rows(cfg, target, tokenizer, acc, tfp: str) -> CorpusRows:
    """The rows of the one corpus cfg.corpus (cfg.train_rows of them), built or read from cache_dir."""
    from draftkit.corpus import build_corpus

    if cfg.messages_column:
        with acc.main_process_first():
            corpus = build_corpus(cfg.corpus, cfg.messages_column)
        train_stream, conversations = None, list(corpus.train["text"])
        heldout = list(corpus.heldout["text"])  # rendered below: as written, or answered by the target
    else:
        corpus, train_stream, heldout = load_streams(cfg, tokenizer, acc)
        conversations = None
    # shard i depends on i and these settings only, so a larger train_rows keeps the shards already made
    written = writer_dtype(cfg, target) if cfg.regenerate else None  # None: by the target itself
    rkey = digest(tfp if cfg.regenerate else "", corpus.fingerprint, cfg.messages_column, cfg.seq_len, cfg.shard_rows,
                  cfg.regenerate, cfg.regen_prompt_len if cfg.regenerate else 0,
                  *([cfg.regen_max_new_tokens] if cfg.regen_max_new_tokens else []),
                  cfg.regen_temperatures if cfg.regenerate else [], cfg.data_seed,
                  *([f"written in {written}"] if written else []))
    store = RowStore(cfg, target, tokenizer, train_stream, conversations, rkey, acc)
    with acc.main_process_first():
        rows, mask = store.build()
        if conversations is not None:
            heldout = store.heldout_rows(heldout)
    fdir = os.path.join(cfg.cache_dir, f"feats-{digest(tfp, rkey)}") if cfg.cache_dir else None
    return CorpusRows(corpus, rows, mask, heldout, fdir)


def interleave(parts: list[torch.Tensor]) -> torch.Tensor:
    """Rows of several (N_i, T) tensors taken in turn (a0, b0, a1, b1, ..., then the longer's rest): the first k
    held-out rows sample every corpus."""
    order = sorted((j, p) for p, t in enumerate(parts) for j in range(t.shape[0]))
    return torch.stack([parts[p][j] for j, p in order])


def joined_heldout(parts: list[CorpusRows]):
    if isinstance(parts[0].heldout, torch.Tensor):  # text: one stream after the other
        return torch.cat([p.heldout for p in parts])
    return interleave([p.heldout[0] for p in parts]), interleave([p.heldout[1] for p in parts])


def target_data(cfg, target, tokenizer, acc, layers=(), seed: int | None = None) -> TargetData:
    """The recipe's rows (built or read from cache_dir; from each corpus of cfg.corpus in turn) and the target's
    outputs at `layers` (plus the last)."""
    from draftkit.corpus import Corpus

    layers = normalize_layers(layers, target.config.num_hidden_layers)
    tfp = target_fingerprint(target) if cfg.regenerate or cfg.data_mode == "cached" else ""
    parts = []
    for source, n in corpus_parts(cfg.corpus, cfg.train_rows):
        one = copy.copy(cfg)  # this corpus's settings (no re-validation: the whole was checked)
        one.corpus, one.train_rows = source, n
        parts.append(corpus_rows(one, target, tokenizer, acc, tfp))
    rows, mask = torch.cat([p.rows for p in parts]), torch.cat([p.mask for p in parts])
    fdirs = [(p.feature_dir, p.rows.shape[0]) for p in parts] if cfg.cache_dir else None
    data = TargetData(cfg, target, rows, mask, layers, joined_heldout(parts), fdirs, acc,
                      cfg.seed if seed is None else seed)
    data.corpus = parts[0].corpus if len(parts) == 1 else Corpus(
        None, None, digest(*[p.corpus.fingerprint for p in parts]), cfg.corpus)
    each = f" ({' + '.join(f'{p.rows.shape[0]:,}' for p in parts)} from {len(parts)} corpora)" if len(parts) > 1 else ""
    acc.print(f"training data: {rows.shape[0]:,} rows{each} x {rows.shape[1]} tokens, {data.tokens_per_epoch:,} "
              f"trained tokens per epoch ({'regenerated by the target' if cfg.regenerate else 'as written'}), target "
              f"outputs {cfg.data_mode} (hidden states {layers})")
    return data
