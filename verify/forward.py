"""One target forward over [prefix] + draft tree on top of the verifier's KV buffer.

Works for any transformers causal LM that accepts a 4D additive attention mask
and explicit position ids (Llama, Qwen2, Mistral, GPT-2, ...). Plain decoding,
trees and batches all take the same path (`Verifier.run`): the step's input
(verify/step.py), a mask written in place, one forward. A model that gets tree
attention wrong is caught by a one-time probe and limited to one sequence with
chains, which then run with the model's own causal masking.
"""
from __future__ import annotations

import torch

from draftkit.verify.cache import KVBuffer
from draftkit.verify.contract import DraftTree
from draftkit.verify.step import SHARED, Piece, StepInputs
from draftkit.verify.tree import MaskBuffer, positions, verify_block, verify_offsets


class TreeAttentionUnsupported(RuntimeError):
    pass


def run_model(model, kv: KVBuffer, masks: MaskBuffer | None, block: torch.Tensor | None,
              offsets: torch.Tensor | None, **inputs):
    """model(**inputs) on top of `kv`; the new entries become pending in kv.

    block (q, C) bool: what each new token sees among the pending and new entries; offsets (q,)
    long: positions relative to each row's committed length (see verify/tree.py). None: the new
    tokens follow the pending ones causally, so the model builds its own mask (even rows only).
    """
    if block is not None:
        inputs["attention_mask"] = masks(kv.lengths, block)
        inputs["position_ids"] = positions(kv.lengths, offsets)
    try:
        return model(cache=kv, use_cache=True, **inputs)
    finally:
        kv.end_forward()


def probe_tolerance(dtype: torch.dtype, scale: float) -> float:
    """How far two correct kernels may put a log-probability apart in `dtype`: a few units in the last place
    of the largest logit (`scale`), and never below 1e-3 (fp32 kernels with different masks agree to ~1e-6).
    bf16 (8 bits of mantissa) at logits of 10 allows about 0.6; a wrong mask moves log-probs by whole nats."""
    return max(1e-3, 8 * torch.finfo(dtype).eps * max(1.0, scale))


def tree_logits_agree(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> bool:
    """out, ref (R, V) logits of the same positions by two routes. They agree when every row's log-probs lie
    within the dtype's tolerance and the top-1 token is the same (or ref's top two are closer than that)."""
    out, ref = out.float().log_softmax(-1), ref.float().log_softmax(-1)
    tol = probe_tolerance(dtype, float(ref.abs().amax().clamp_max(1e4)) if ref.isfinite().all() else 1e4)
    likely = ref > ref.amax(-1, keepdim=True) - 20  # the tail below e^-20 of the top carries no decision
    close = bool(((out - ref).abs()[likely] <= tol).all())
    top2 = ref.topk(2, -1).values if ref.shape[-1] > 1 else ref.repeat(1, 2)
    same_top = (out.argmax(-1) == ref.argmax(-1)) | (top2[:, 0] - top2[:, 1] <= tol)
    return close and bool(same_top.all())


def rejects_inputs(err: BaseException) -> bool:
    """An error by which a model says it cannot take a 4D mask or explicit position ids. Out-of-memory and
    anything else unexpected are not that: they must reach the user, not mark the model "no tree attention"."""
    if isinstance(err, torch.OutOfMemoryError):
        return False
    if isinstance(err, (TypeError, ValueError, NotImplementedError, IndexError)):
        return True
    return isinstance(err, RuntimeError) and any(w in str(err) for w in ("shape", "size", "dimension", "expand"))


def probe_tree_attention(model) -> bool:
    """Does a branched tree give the logits of running each branch on its own (up to the dtype's rounding)?"""
    cached = getattr(model, "_draftkit_tree_ok", None)
    if cached is not None:
        return cached
    dev = model.device
    vocab = model.config.get_text_config().vocab_size if hasattr(model.config, "get_text_config") \
        else model.config.vocab_size
    prefix = torch.tensor([1 % vocab, 2 % vocab], device=dev)
    tree = DraftTree.from_lists([3 % vocab, 4 % vocab, 5 % vocab], [-1, -1, 1], dev).validate()
    with torch.no_grad():
        try:
            kv = KVBuffer.for_model(model, capacity=8)
            out = run_model(model, kv, MaskBuffer(model.dtype, dev), verify_block(tree, 2), verify_offsets(tree, 2),
                            input_ids=torch.cat([prefix, tree.tokens])[None]).logits[0]
            # branch 2: prefix + node 1 + node 2 on its own, with the model's own causal mask
            ref = model(input_ids=torch.cat([prefix, tree.tokens[1:]])[None]).logits[0, -3:]
            ok = tree_logits_agree(out[[1, 3, 4]], ref, model.dtype)
        except Exception as err:  # noqa: BLE001 -- sorted by rejects_inputs; the rest is raised again
            if not rejects_inputs(err):
                raise
            ok = False
    model._draftkit_tree_ok = ok
    return ok


def output_vocab(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def context_limit(model) -> int | None:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


class Verifier:
    """Holds the target, its KV buffer (one row, shared by every lane of a batch), the owner of each
    committed entry (a lane's index, or SHARED) and the mask buffer: the one forward path of the loop."""

    def __init__(self, model, capacity: int = 256):
        self.model = model
        self.vocab_size = output_vocab(model)
        self.tree_ok = None  # probed before the first forward
        self.max_len = context_limit(model)
        self.masks = MaskBuffer(model.dtype, model.device)
        self.kv = KVBuffer.for_model(model, capacity=capacity)
        self.owner = torch.full((max(capacity, 1),), SHARED, dtype=torch.long, device=model.device)
        self.peak_entries = 0
        self.peak_logits_bytes = 0

    @property
    def cache_len(self) -> int:
        return self.kv.lengths[0]

    def _needs_mask(self, step: StepInputs) -> bool:
        """Whether the forward needs a 4D mask: not for one lane whose input is a chain on top of a cache it
        owns entirely (plain decoding, chain drafters), which runs with the model's own causal mask."""
        if len(step.pieces) == 1 and not step.branched and step.pieces[0].owner in (0, SHARED) \
                and self.cache_len == step.pieces[0].position:
            return False
        if self.tree_ok is None:
            self.tree_ok = probe_tree_attention(self.model)
        if not self.tree_ok:
            raise TreeAttentionUnsupported(
                f"{type(self.model).__name__} does not give correct logits under a 4D tree attention mask; "
                "use a chain drafter (tree size 1 per depth) with this model, one sequence at a time")
        return True

    def run(self, step: StepInputs, hidden_layers: tuple[int, ...] = (), logits_to_keep: int | None = None):
        """One target forward over the step's q new rows on top of the cache. Returns logits (k, V) of the
        last k = logits_to_keep rows (default: all q) and the requested hidden-state layers, one (q, H) each,
        or None. The q new entries stay pending until `commit_rows`."""
        inputs = dict(input_ids=step.ids[None], logits_to_keep=logits_to_keep or step.q,
                      output_hidden_states=bool(hidden_layers))
        if self._needs_mask(step):
            owner = self.owner[:self.cache_len]  # (W,): each committed entry's lane
            past = (owner[None] == step.lane[:, None]) | (owner == SHARED)[None]  # (q, W)
            inputs["attention_mask"] = self.masks.write(past, step.block)
            inputs["position_ids"] = step.pos[None]
        try:
            out = self.model(cache=self.kv, use_cache=True, **inputs)
        finally:
            self.kv.end_forward()
        self.peak_entries = max(self.peak_entries, self.kv.lengths[0] + self.kv.pending)
        self.peak_logits_bytes = max(self.peak_logits_bytes, out.logits.numel() * out.logits.element_size())
        states = tuple(out.hidden_states[i][0] for i in hidden_layers) if hidden_layers else None
        return out.logits[0], states

    def commit_rows(self, step: StepInputs, keep: torch.Tensor, keep_host: list[int]) -> None:
        """Keep the pending rows `keep` (K,) long on the device, ascending (keep_host: the same on the host),
        in that order, with their lanes as owners; drop the other pending rows. No upload."""
        w, k = self.cache_len, len(keep_host)
        if w + k > self.owner.numel():
            grown = torch.full((2 * (w + k),), SHARED, dtype=torch.long, device=self.owner.device)
            grown[:self.owner.numel()] = self.owner
            self.owner = grown
        self.owner[w:w + k] = step.lane[keep]
        self.kv.keep(keep, keep_host)

    @torch.no_grad()
    def forward(self, prefix: torch.Tensor, tree: DraftTree, hidden_layers: tuple[int, ...] = ()):
        """One sequence: prefix (m,) committed tokens not yet cached (last = root); tree of n nodes.

        Returns logits (n + 1, V) at the root and each node, and the requested hidden-state layers
        (one (m + n, H) tensor each) or None. The m + n new entries stay pending; `commit` next.
        """
        step = StepInputs([Piece(0, self.cache_len, prefix, tree.validate())], self.model.device)
        logits, states = self.run(step, hidden_layers, len(tree) + 1)
        return logits, states

    def commit(self, prefix_len: int, accepted: list[int]) -> None:
        """Keep the prefix and the accepted nodes' entries; O(accepted) copies at most."""
        self.kv.commit(list(range(prefix_len)) + [prefix_len + a for a in accepted])
