"""P-EAGLE: the reference EAGLE-3 draft drafting every depth in ONE forward (parallel drafting; Hui et al.
2026, arXiv 2602.01469; vLLM `eagle3` with `"parallel_drafting": true`; vllm-project/speculators `peagle`).

EAGLE-3 runs its draft once per depth, feeding back its own output. P-EAGLE appends K - 1 placeholder pairs
to the step's one draft forward instead: pair (f_t, x_{t+1}) at position t predicts x_{t+2} as in EAGLE-3,
and a placeholder at position t + j (j = 1 .. K - 1) pairs `mask_hidden` (a learned vector in the space of
the three fused target layers, 3H, fused by the same fc) with the embedding of `mask_token_id`. Attention
is causal, so placeholder j sees the committed pairs, the root's pair and the placeholders before it, and
predicts x_{t+2+j}: depth j + 1 of the draft. One forward yields every depth's distribution; the depth-d
distribution does not depend on the tokens drafted above it, so a chain or a tree is cut from the K
per-depth distributions (drafters.tree_search.draft_from_depths) and a sampled token's q is its depth's q.

The weights are EAGLE-3's plus `mask_hidden` (1, 1, 3H); the config adds `mask_token_id`. The placeholder
entries never enter the draft cache: the committed pairs' entries are kept, as in EagleDrafter.
"""
from __future__ import annotations

import torch
from torch import nn

from draftkit.drafters.eagle import EagleDrafter
from draftkit.drafters.eagle_reference import Eagle3Draft


class PEagleDraft(Eagle3Draft):
    """Eagle3Draft plus the placeholder feature `mask_hidden` (1, 1, 3H); config.mask_token_id is set."""

    def __init__(self, config):
        super().__init__(config)
        if config.mask_token_id is None or not 0 <= config.mask_token_id < config.vocab_size:
            raise ValueError(f"a P-EAGLE draft needs mask_token_id in [0, {config.vocab_size}), "
                             f"got {config.mask_token_id}")
        h = config.hidden_size * len(config.feature_layers)
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, h) * self.layer_config.initializer_range)

    def placeholders(self, n: int) -> torch.Tensor:
        """(n, 3H) copies of mask_hidden: the features of n placeholder pairs."""
        return self.mask_hidden.reshape(1, -1).expand(n, -1)


@torch.no_grad()
def make_peagle_draft(target, feature_layers, mask_token_id: int, draft_ids: torch.Tensor | None = None,
                      init_from_target: bool = False, draft_layers: int = 1) -> PEagleDraft:
    """A fresh P-EAGLE draft for `target`, initialised as make_draft initialises a reference EAGLE-3 draft.
    One decoder layer can only gather raw inputs for a placeholder (depth >= 2 then sees no guess of the tokens
    above it); deeper drafts (the published ones have 4 layers) let later layers read what earlier ones made."""
    from draftkit.drafters.eagle_reference import make_draft

    base = make_draft(target, feature_layers, "reference", draft_ids, init_from_target, draft_layers)
    return peagle_from_eagle3(base, mask_token_id)


def peagle_from_eagle3(base: Eagle3Draft, mask_token_id: int) -> PEagleDraft:
    """A P-EAGLE draft warm-started from a trained EAGLE-3 draft: its weights, a fresh mask_hidden.

    Depth 1 of P-EAGLE is exactly EAGLE-3's next-token prediction, so the base's weights are the right start;
    only the placeholder feature is new.
    """
    config = base.config
    config.mask_token_id = int(mask_token_id)
    draft = PEagleDraft(config)
    state = draft.state_dict()
    state.update(base.state_dict())
    draft.load_state_dict(state)
    return draft.float()


class PEagleDrafter(EagleDrafter):
    """Every depth of the step's chain or tree from one draft forward (see the module docstring).

    max_depth: draft depth (K); max_nodes: tree size cap; top_k: children per node (1: a chain).
    """

    def __init__(self, target, draft: PEagleDraft, **flags):
        if not isinstance(draft, PEagleDraft):
            raise ValueError("PEagleDrafter needs a P-EAGLE draft (an EAGLE-3 draft with mask_hidden and "
                             "mask_token_id); train one with recipes/eagle/peagle.yaml")
        super().__init__(target, draft, **flags)

    @classmethod
    def from_pretrained(cls, path: str, target, **flags) -> "PEagleDrafter":
        from draftkit.drafters.formats import load_eagle_draft

        return cls(target, load_eagle_draft(path, target), **flags)

    @staticmethod
    def lanes_class():
        from draftkit.drafters.eagle_lanes import PEagleLanes

        return PEagleLanes


__all__ = ["PEagleDraft", "PEagleDrafter", "make_peagle_draft"]
