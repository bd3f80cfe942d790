"""A small causal LM with the target's tokenizer as the drafter.

It keeps its own KV cache (a KVBuffer, like the verifier's) over the committed
tokens. Drafting appends pending entries for the draft nodes it runs; after
verification the entries of the accepted nodes are committed (they hold exactly
the committed tokens) and the rest dropped, so nothing already computed is
computed again. Tokens it has not seen (the bonus, accepted nodes that never ran,
or everything since the last draft when a step drafted nothing) are fed at the
start of the next proposal.
"""
from __future__ import annotations

import torch
from draftkit.drafters.lanes import DraftLanes, compatible
from draftkit.drafters.tree_search import kept_entries
from draftkit.verify.accept import Sampling
from draftkit.verify.cache import KVBuffer  # the same cache class the verifier uses
from draftkit.verify.contract import Budget, DecodeState, DraftMismatch, DraftTree, StepResult
from draftkit.verify.lanes import lanes_forming
from draftkit.verify.forward import context_limit
from draftkit.verify.tree import run_model


def check_same_vocabulary(target, draft, target_tokenizer=None, draft_tokenizer=None,
                          target_name: str = "target", draft_name: str = "draft") -> None:
    """Raise a clear error when the two models cannot share token ids."""
    tv = target.get_output_embeddings().weight.shape[0]
    dv = draft.get_output_embeddings().weight.shape[0]
    if tv != dv:
        raise DraftMismatch(f"vocabulary mismatch: {target_name} has {tv} output tokens, {draft_name} has {dv}; "
                         "a drafter must use the target's tokenizer")
    if target_tokenizer is not None and draft_tokenizer is not None:
        if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise DraftMismatch(f"tokenizer mismatch: {target_name} ({type(target_tokenizer).__name__}, "
                             f"{len(target_tokenizer)} tokens) and {draft_name} ({type(draft_tokenizer).__name__}, "
                             f"{len(draft_tokenizer)} tokens) map tokens to different ids")


class StandaloneDrafter:
    """Chain (top_k == 1) or EAGLE-2 style dynamic tree from a small causal LM.

    max_depth: draft depth (K for a chain); max_nodes: tree size cap (a chain uses max_depth);
    top_k: children expanded per node (1 = chain). The budget each step may be smaller. compile_draft: the
    draft's forwards run with static shapes, compiled (a graph per lanes x bucket x buffer size).
    In sampling mode a chain is sampled from the draft at `temperature` (default: the sampling
    temperature) and q returned; a tree's children are drawn from q without replacement
    (drafters.tree_search.sampled_search; verified by recursive rejection sampling). `sampling`:
    the decoding's Sampling, whose top-k / top-p q then gets too. Greedy trees are deterministic
    top-k proposals (one-hot q). Acceptance is lossless either way.
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model, max_depth: int = 4, max_nodes: int | None = None, top_k: int = 1,
                 temperature: float | None = None, target=None,
                 sampling: Sampling | None = None, compile_draft: bool = False):
        if target is not None:
            check_same_vocabulary(target, model)
        if max_depth < 1:
            raise ValueError(f"draft depth max_depth must be >= 1, got {max_depth}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        max_nodes = max_nodes or (max_depth if top_k == 1 else min(64, max_depth * top_k * 2))
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        self.model = model.eval()
        self.top_k = top_k
        self.budget_cap = Budget(max_depth, max_nodes)
        self.temperature = temperature
        self.sampling = sampling
        self.compile_draft = compile_draft  # static-shape draft forwards, compiled (verify/tree.py run_model)
        self.max_len = context_limit(model)
        self.cache = None
        self.alone = StandaloneLanes([self])  # one sequence drafts as a group of one (drafters/lanes.py)

    def lane(self) -> "StandaloneDrafter":
        """A drafter for another lane of a batch: the same draft model (shared, so the lanes can draft
        together) and settings, a state of its own."""
        cap = self.budget_cap
        return StandaloneDrafter(self.model, cap.max_depth, cap.max_nodes, self.top_k, self.temperature,
                                 sampling=self.sampling, compile_draft=self.compile_draft)

    @classmethod
    def draft_lanes(cls, drafters: list) -> "StandaloneLanes | None":
        """The lanes of a batch drafting together (drafters/lanes.py), when they share a draft and settings."""
        return StandaloneLanes(drafters) if compatible(drafters, "model") else None

    def reset(self, prompt: torch.Tensor) -> None:
        self.alone.reset(2 * prompt.numel() + 256, warm=not lanes_forming())  # out of any batch's group

    def warm(self) -> None:
        self.alone.warm_alone()  # verify/lanes.py forming_lanes

    def propose(self, state: DecodeState) -> DraftTree:
        return self.alone.propose([state])[0]

    def update(self, result: StepResult) -> None:
        # keep the draft entries of the accepted path that went through the draft; drop the rest
        entries = kept_entries(result.tree, result.accepted) if result.accepted and len(result.tree) else []
        self.group.keep(self, entries)  # the group commits every lane's row at once, before it next drafts


class StandaloneLanes(DraftLanes):
    """StandaloneDrafters of one draft model and the same settings, drafting as one group (drafters/lanes.py):
    the catch-up runs each drafting lane's committed tokens the draft has not seen (ragged, one forward), each
    level every lane's frontier tokens."""

    def __init__(self, drafters: list):
        model = drafters[0].model
        self.model, self.max_len = model, drafters[0].max_len  # before the group forms (it may warm the draft)
        super().__init__(drafters, KVBuffer.layers_of(model), model.dtype, model.device)

    def wants(self, r: int, state: DecodeState) -> bool:
        return super().wants(r, state) and not (self.max_len and
                                                state.tokens.numel() + state.budget.max_nodes > self.max_len)

    def catch_up(self, rows: list[int], states: list) -> torch.Tensor:
        new = {r: states[r].tokens[self.cache.lengths[r]:].to(self.device) for r in rows}
        k = {r: x.numel() for r, x in new.items()}
        q = max(k.values())
        last = sorted({k[r] - 1 for r in rows})  # the positions whose logits some lane needs: its root
        if len(self.drafters) == 1:  # one sequence: causal by itself, its last logits only
            out = run_model(self.model, self.cache, self.masks, None, None, self.compile,
                            input_ids=self.padded(new, q), logits_to_keep=1)
        else:
            causal = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
            out = run_model(self.model, self.cache, self.masks, causal, torch.arange(q, device=self.device),
                            self.compile, input_ids=self.padded(new, q),
                            logits_to_keep=torch.tensor(last, device=self.device))
        self.cache.commit([list(range(k[r])) if r in k else [] for r in range(len(self.drafters))])
        return torch.stack([out.logits[r, last.index(k[r] - 1)] for r in rows])

    @property
    def draft_model(self):
        return self.model

    def warm_inputs(self, n: int, b: int) -> list[dict]:
        return [dict(input_ids=torch.zeros(n, b, dtype=torch.long, device=self.device))]

    def run_nodes(self, requests: dict, block: torch.Tensor, offsets: torch.Tensor, q: int) -> dict:
        ids = self.padded({r: req[0] for r, req in requests.items()}, q)
        logits = run_model(self.model, self.cache, self.masks, block, offsets, self.compile, input_ids=ids).logits
        return {r: logits[r, :req[0].numel()] for r, req in requests.items()}
