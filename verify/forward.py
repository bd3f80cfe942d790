"""One target forward over [prefix] + draft tree on top of the KV cache.

Works for any transformers causal LM that accepts a 4D additive attention mask
and explicit position ids (Llama, Qwen2, Mistral, GPT-2, ...). Chains need
neither: they run with the model's own causal masking, which is also how plain
decoding runs, so the baseline pays no mask overhead. A model that gets tree
attention wrong is caught by a one-time probe and limited to chains.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from drafters.base import DraftTree
from verify.tree import is_chain, tree_attention_mask, tree_positions


class TreeAttentionUnsupported(RuntimeError):
    pass


def model_forward(model, input_ids, cache, cache_len, tree: DraftTree, prefix_len: int,
                  logits_to_keep: int, hidden: bool):
    """Raw forward; returns the transformers output. input_ids (1, m + n)."""
    kwargs = dict(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=logits_to_keep,
                  output_hidden_states=hidden)
    if not is_chain(tree):
        kwargs["attention_mask"] = tree_attention_mask(tree, cache_len, prefix_len, model.dtype, model.device)
        kwargs["position_ids"] = tree_positions(tree, cache_len, prefix_len, model.device)
    return model(**kwargs)


def probe_tree_attention(model, atol: float = 1e-3) -> bool:
    """Does a branched tree give the same logits as running each branch on its own?"""
    cached = getattr(model, "_draftkit_tree_ok", None)
    if cached is not None:
        return cached
    dev = model.device
    vocab = model.config.vocab_size
    prefix = torch.tensor([[1 % vocab, 2 % vocab]], device=dev)
    tree = DraftTree(torch.tensor([3 % vocab, 4 % vocab, 5 % vocab], device=dev),
                     torch.tensor([-1, -1, 1], device=dev)).validate()
    ok = True
    with torch.no_grad():
        try:
            out = model_forward(model, torch.cat([prefix, tree.tokens[None]], 1), DynamicCache(config=model.config),
                                0, tree, 2, 4, False).logits[0].float()
            # branch 2: prefix + node 1 + node 2 on its own
            ref = model(input_ids=torch.cat([prefix, tree.tokens[None, 1:]], 1)).logits[0, -3:].float()
            ok = torch.allclose(out[[0, 2, 3]], ref, atol=atol, rtol=1e-3)
        except Exception:  # the model rejected a 4D mask or position ids
            ok = False
    model._draftkit_tree_ok = ok
    return ok


class Verifier:
    """Holds the target and its KV cache for one sequence."""

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.tree_ok = None  # probed on the first branched tree
        self.max_len = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cache_len = 0

    @torch.no_grad()
    def forward(self, prefix: torch.Tensor, tree: DraftTree, hidden: bool):
        """prefix (m,) committed tokens not yet cached (last = root); tree of n nodes.

        Returns logits (n + 1, V) at the root and each node, and hidden states (one (m + n, H)
        per layer) or None. The cache grows by m + n; call `compact` next.
        """
        if not is_chain(tree):
            if self.tree_ok is None:
                self.tree_ok = probe_tree_attention(self.model)
            if not self.tree_ok:
                raise TreeAttentionUnsupported(
                    f"{type(self.model).__name__} does not give correct logits under a 4D tree attention mask; "
                    "use a chain drafter (tree size 1 per depth) with this model")
        ids = torch.cat([prefix, tree.tokens]).unsqueeze(0)
        out = model_forward(self.model, ids, self.cache, self.cache_len, tree, prefix.numel(), len(tree) + 1, hidden)
        states = tuple(h[0] for h in out.hidden_states) if hidden else None
        return out.logits[0], states
