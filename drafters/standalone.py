"""A small causal LM with the target's tokenizer as the drafter.

It keeps its own KV cache over the committed tokens. Drafting appends entries
for the draft nodes it runs; after verification the entries of the accepted
nodes are kept (they hold exactly the committed tokens) and the rest dropped,
so nothing already computed is computed again.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from drafters.base import DecodeState, DraftTree, StepResult
from drafters.tree_search import dynamic_tree, kept_entries, sample_chain
from verify.cache import compact  # the same compaction the target's cache uses


def check_same_vocabulary(target, draft, target_tokenizer=None, draft_tokenizer=None,
                          target_name: str = "target", draft_name: str = "draft") -> None:
    """Raise a clear error when the two models cannot share token ids."""
    tv = target.get_output_embeddings().weight.shape[0]
    dv = draft.get_output_embeddings().weight.shape[0]
    if tv != dv:
        raise ValueError(f"vocabulary mismatch: {target_name} has {tv} output tokens, {draft_name} has {dv}; "
                         "a drafter must use the target's tokenizer")
    if target_tokenizer is not None and draft_tokenizer is not None:
        if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise ValueError(f"tokenizer mismatch: {target_name} ({type(target_tokenizer).__name__}, "
                             f"{len(target_tokenizer)} tokens) and {draft_name} ({type(draft_tokenizer).__name__}, "
                             f"{len(draft_tokenizer)} tokens) map tokens to different ids")


class StandaloneDrafter:
    """Chain of `k` tokens (top_k == 1) or an EAGLE-2 style dynamic tree from a small model.

    k: draft depth; top_k: children expanded per node (1 = chain); total_tokens: tree size cap.
    In sampling mode a chain is sampled from the draft at `temperature` (default: the sampling
    temperature) and q returned; trees are deterministic
    top-k proposals (one-hot q), which keeps acceptance lossless either way.
    """

    needs_hidden_states = False

    def __init__(self, model, k: int = 4, top_k: int = 1, total_tokens: int | None = None,
                 temperature: float | None = None, seed: int | None = None, target=None):
        if target is not None:
            check_same_vocabulary(target, model)
        if k < 1:
            raise ValueError(f"draft length k must be >= 1, got {k}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.model = model.eval()
        self.k, self.top_k = k, top_k
        self.total_tokens = total_tokens or (k if top_k == 1 else min(64, k * top_k * 2))
        if self.total_tokens < 1:
            raise ValueError(f"total_tokens must be >= 1, got {self.total_tokens}")
        self.temperature = temperature
        self.gen = torch.Generator().manual_seed(seed) if seed is not None else None
        self.max_len = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)

    def reset(self, prompt: torch.Tensor) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cache_len = 0  # committed tokens held by the draft cache
        self.run = 0  # draft-node entries appended after them this step

    def _forward(self, tokens, parent_ids, tree_mask, depths):
        """Run draft nodes on top of the committed cache. tokens (k,), tree_mask (k, run + k)."""
        k = tokens.numel()
        kwargs = {}
        if not bool(tree_mask.all()):  # a chain needs only the model's causal mask
            allowed = torch.cat([torch.ones(k, self.cache_len, dtype=torch.bool), tree_mask], 1)
            mask = torch.zeros(allowed.shape, dtype=self.model.dtype).masked_fill_(~allowed, torch.finfo(self.model.dtype).min)
            kwargs = dict(attention_mask=mask[None, None].to(self.model.device),
                          position_ids=(self.cache_len - 1 + depths)[None].to(self.model.device))
        out = self.model(input_ids=tokens[None].to(self.model.device), cache=self.cache, use_cache=True, **kwargs)
        self.run += k
        return out.logits[0]

    @torch.no_grad()
    def propose(self, state: DecodeState) -> DraftTree:
        depth = min(self.k, state.budget - 1)
        if depth < 1 or (self.max_len and state.tokens.numel() + self.total_tokens > self.max_len):
            return DraftTree.empty(state.tokens.device)
        # catch up on committed tokens the draft has not seen (at least the root)
        new = state.tokens[self.cache_len:]
        logits = self.model(input_ids=new[None].to(self.model.device), cache=self.cache, use_cache=True,
                            logits_to_keep=1).logits[0, -1]
        self.cache_len, self.run = state.tokens.numel(), 0
        if self.top_k == 1:
            tree = sample_chain(logits, self._forward, depth, state.greedy, self.gen,
                                self.temperature or state.temperature)
        else:
            tree = dynamic_tree(logits, self._forward, depth, self.top_k, self.total_tokens)
        return tree

    def update(self, result: StepResult) -> None:
        # the verifier may have dropped the tree (context end): then nothing was accepted
        entries = kept_entries(result.tree, result.accepted) if result.accepted else []
        self.cache_len = compact(self.cache, self.cache_len, 0, self.run, entries)
        self.run = 0
