"""The rows every drafter recipe trains on (train/targetdata.py reads them): windows of the corpus or rendered
conversations, optionally continued or answered by the target, written shard by shard under
cache_dir/rows-<key>/ (each shard on its own: a killed run redoes at most one).

    ids, mask = conversation_rows(tokenizer, conversations, seq_len)   # (N, T) int32, (N, T) bool
    store = RowStore(cfg, target, tokenizer, stream, conversations, key, acc); rows, mask = store.build()

mask[t] is True where token t + 1 is trained on (a generated or assistant token).
"""
from __future__ import annotations

import copy
import os

import torch
from tqdm import tqdm

from draftkit.drafters.draft_dtype import native_bf16
from draftkit.files import write_atomically
from draftkit.train.config import TrainError
from draftkit.train.data import BlockSampler


def save_shard(obj, path: str) -> None:
    write_atomically(path, lambda scratch: torch.save(obj, scratch))  # never a shard that only looks complete


def render_conversation(tokenizer, messages: list[dict], seq_len: int) -> tuple[list[int], list[bool]]:
    """(token ids, is-assistant per token) of one conversation under the tokenizer's chat template, cut to seq_len.

    Assistant spans are found by rendering the conversation up to each assistant turn (with the generation
    prompt) and through it: a template whose renderings are not prefixes of each other is refused."""
    if not getattr(tokenizer, "chat_template", None):
        raise TrainError("messages_column needs a tokenizer with a chat template (tokenizer.chat_template is empty)")
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        start = len(tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True))
        end = len(tokenizer.apply_chat_template(messages[:i + 1], tokenize=False))
        if not full.startswith(tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)) or start > end:
            raise TrainError("the chat template's renderings of a conversation's prefixes are not prefixes of the "
                             "whole: assistant tokens cannot be located")
        spans.append((start, end))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"][:seq_len], enc["offset_mapping"][:seq_len]
    assistant = [any(s <= a < e for s, e in spans) for a, _ in offsets]
    return ids, assistant


def _pad_row(ids: list[int], trained: list[bool], seq_len: int, pad: int) -> tuple[list[int], list[bool]]:
    """One (T,) row and its loss mask: mask[t] = token t + 1 is trained on; padding is never trained."""
    n = len(ids)
    ids = ids + [pad] * (seq_len - n)
    mask = [bool(trained[t + 1]) for t in range(n - 1)] + [False] * (seq_len - n + 1)
    return ids, mask


@torch.no_grad()
def continue_text(target, prompts: torch.Tensor, new: int, temperature: float, eos: int, seed: int) -> torch.Tensor:
    """(B, P) prompts -> (B, P + new) with the target's continuation; rows that emitted EOS are padded with EOS."""
    torch.manual_seed(seed)  # generate's sampling draws from the global generator
    sample = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
        else dict(do_sample=False)
    out = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new,
                          pad_token_id=eos, eos_token_id=eos, **sample)
    if out.shape[1] < prompts.shape[1] + new:  # every row stopped early
        out = torch.cat([out, out.new_full((out.shape[0], prompts.shape[1] + new - out.shape[1]), eos)], 1)
    return out


def _text_mask(rows: torch.Tensor, prompt_len: int, eos: int) -> torch.Tensor:
    """(B, T) loss mask of regenerated text rows: generated tokens up to and including the first EOS."""
    gen = rows[:, prompt_len:]
    after_eos = (gen == eos).int().cumsum(1) - (gen == eos).int() > 0  # strictly after the first EOS
    trained = torch.zeros_like(rows, dtype=torch.bool)
    trained[:, prompt_len:] = ~after_eos
    mask = torch.zeros_like(trained)
    mask[:, :-1] = trained[:, 1:]
    return mask


@torch.no_grad()
def regenerate_conversations(target, tokenizer, convs: list[list[dict]], seq_len: int, temperature: float,
                             seed: int, max_new_tokens: int = 0) -> list[list[dict]]:
    """Every assistant turn rewritten by the target, in order, given the conversation so far (batched per turn);
    a turn marked {"keep": True} stays as written (train/self_instruct.py's examples)."""
    convs = [[dict(m) for m in c] for c in convs]
    eos = tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        turn = 0
        while True:
            todo = [(c, [i for i, m in enumerate(c) if m.get("role") == "assistant" and not m.get("keep")])
                    for c in convs]
            todo = [(c, idx[turn]) for c, idx in todo if len(idx) > turn]
            if not todo:
                return convs
            texts = [tokenizer.apply_chat_template(c[:i], tokenize=False, add_generation_prompt=True) for c, i in todo]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
            room = max(1, seq_len - int(enc["attention_mask"].sum(1).min()))
            room = min(room, max_new_tokens) if max_new_tokens > 0 else room
            torch.manual_seed(seed + turn)
            sample = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
                else dict(do_sample=False)
            # a static cache: a dynamic one concatenates every layer's keys each step (O(T^2) copies at batch 64)
            out = target.generate(**enc, max_new_tokens=room, pad_token_id=eos, eos_token_id=eos,
                                  cache_implementation="static", **sample)
            for (c, i), row in zip(todo, out[:, enc["input_ids"].shape[1]:].tolist()):
                c[i]["content"] = tokenizer.decode(row[:row.index(eos)] if eos in row else row,
                                                   skip_special_tokens=True)
            turn += 1
    finally:
        tokenizer.padding_side = side


def writer_dtype(cfg, target) -> torch.dtype | None:
    """The precision regen_dtype asks the answers to be written in, or None where it is the target's own. "auto":
    bf16 for a float32 target on a device that runs bf16 matrix products natively (a GPU that supports bf16, a
    CPU with AVX512-BF16 or AMX: drafters/draft_dtype.py), else the target's own."""
    if cfg.regen_dtype == "auto":
        device = target.device
        native = torch.cuda.is_bf16_supported() if device.type == "cuda" else native_bf16(device)
        dtype = torch.bfloat16 if target.dtype == torch.float32 and native else None
    else:
        dtype = getattr(torch, cfg.regen_dtype) if cfg.regen_dtype else None
    return None if dtype is None or dtype == target.dtype else dtype


class RowStore:
    """The training rows, written shard by shard (resumable, with progress) and read back as (N, T) tensors."""

    def __init__(self, cfg, target, tokenizer, train_stream: torch.Tensor, conversations, key: str, acc):
        self.cfg, self.target, self.tokenizer, self.acc = cfg, target, tokenizer, acc
        self.stream, self.conversations = train_stream, conversations
        self.dir = os.path.join(cfg.cache_dir, f"rows-{key}") if cfg.cache_dir else None  # None: kept in memory
        self.shards = (cfg.train_rows + cfg.shard_rows - 1) // cfg.shard_rows
        self._writer = None

    @property
    def writer(self):
        """The model that writes the training answers: the target, or a copy of it in regen_dtype (made once, on
        first use: a shard store that is complete never makes it). The copy, not a cast of the target in place,
        so that the hidden states stored afterwards are the target's own."""
        dtype = writer_dtype(self.cfg, self.target) if self.cfg.regenerate else None
        if dtype is None:
            return self.target
        if self._writer is None:
            self._writer = copy.deepcopy(self.target).to(dtype).eval()
        return self._writer

    def shard_path(self, i: int) -> str:
        return os.path.join(self.dir, f"{i:05d}.pt")

    def build(self) -> tuple[torch.Tensor, torch.Tensor]:
        what = "regenerate" if self.cfg.regenerate else "rows"
        bar = dict(desc=what, disable=not self.acc.is_local_main_process)
        if self.dir is None:
            parts = [self.make_shard(i) for i in tqdm(range(self.shards), **bar)]
            return torch.cat([p["ids"] for p in parts]), torch.cat([p["mask"] for p in parts])
        os.makedirs(self.dir, exist_ok=True)
        todo = [i for i in range(self.shards) if not os.path.exists(self.shard_path(i))]
        for i in tqdm(todo, **{**bar, "desc": f"{what} ({len(todo)}/{self.shards} shards)"}):
            save_shard(self.make_shard(i), self.shard_path(i))
        parts = [torch.load(self.shard_path(i)) for i in range(self.shards)]
        return torch.cat([p["ids"] for p in parts]), torch.cat([p["mask"] for p in parts])

    def _count(self, i: int) -> int:
        return self.cfg.shard_rows  # whole shards only: shard i never depends on train_rows

    def heldout_rows(self, convs: list) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) of the held-out conversations (at most heldout_rows of them): with `regenerate`, answered by the
        target greedily (what the draft is measured against is the target's own answers), stored beside the shards."""
        convs = convs[:self.cfg.heldout_rows]
        if not self.cfg.regenerate:
            return conversation_rows(self.tokenizer, convs, self.cfg.seq_len)
        path = os.path.join(self.dir, "heldout.pt") if self.dir else None
        if path and os.path.exists(path):
            part = torch.load(path)
        else:
            self.acc.print(f"regenerating {len(convs)} held-out conversations")
            convs = regenerate_conversations(self.target, self.tokenizer, convs, self.cfg.seq_len, 0.0,
                                             self.cfg.data_seed, self.cfg.regen_max_new_tokens)
            ids, mask = conversation_rows(self.tokenizer, convs, self.cfg.seq_len)
            part = {"ids": ids, "mask": mask}
            if path:
                save_shard(part, path)
        return part["ids"], part["mask"]

    def make_shard(self, i: int) -> dict:
        cfg, eos = self.cfg, self.tokenizer.eos_token_id
        temperature = cfg.regen_temperatures[i % len(cfg.regen_temperatures)]
        seed = cfg.data_seed * 1_000_003 + i
        if self.conversations is not None:
            first = i * cfg.shard_rows
            convs = [self.conversations[(first + j) % len(self.conversations)] for j in range(self._count(i))]
            if cfg.regenerate:
                convs = regenerate_conversations(self.writer, self.tokenizer, convs, cfg.seq_len, temperature, seed,
                                                 cfg.regen_max_new_tokens)
            ids, mask = conversation_rows(self.tokenizer, convs, cfg.seq_len)
            return {"ids": ids, "mask": mask}
        block = BlockSampler(self.stream, cfg.seq_len, self._count(i), cfg.data_seed + 7919).batch(i)  # (b, T)
        if not cfg.regenerate:
            mask = torch.ones_like(block, dtype=torch.bool)
            mask[:, -1] = False
            return {"ids": block.to(torch.int32), "mask": mask}
        prompts = block[:, :cfg.regen_prompt_len].to(self.target.device)
        rows = continue_text(self.writer, prompts, cfg.seq_len - cfg.regen_prompt_len, temperature, eos, seed).cpu()
        return {"ids": rows.to(torch.int32), "mask": _text_mask(rows, cfg.regen_prompt_len, eos)}


def conversation_rows(tokenizer, convs, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) int32 ids and (N, T) bool loss masks of conversations rendered as written."""
    rows = [_pad_row(*render_conversation(tokenizer, c, seq_len), seq_len, tokenizer.eos_token_id) for c in convs]
    return (torch.tensor([r[0] for r in rows], dtype=torch.int32).reshape(-1, seq_len),
            torch.tensor([r[1] for r in rows], dtype=torch.bool).reshape(-1, seq_len))
