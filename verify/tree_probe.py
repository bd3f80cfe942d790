"""Does a model give correct logits under a tree attention mask? A one-time probe (`probe_tree_attention`, kept
on the model) compares a branched tree's logits with each branch run on its own, past a sliding window or chunk
boundary when the model has one; a model that fails is limited to chains (verify/forward.py raises
`TreeAttentionUnsupported` where a step would need a tree). `tree_logits_agree` and `probe_tolerance` tell a
kernel's rounding in the model's dtype from a wrong mask (eval/divergence.py uses the same tolerance)."""
from __future__ import annotations

import torch

from draftkit.verify.attention_layout import AttentionLayout
from draftkit.verify.cache import KVBuffer
from draftkit.verify.contract import DraftTree
from draftkit.verify.gqa import cpu_kernels
from draftkit.verify.tree import MaskBuffer, run_model, verify_block, verify_offsets


class TreeAttentionUnsupported(RuntimeError):
    pass


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
    span = AttentionLayout.of(model).widest_window
    # past a window or chunk boundary when the model has one (and it is short enough to probe), so that a
    # wrong per-layer mask shows; else the two tokens any tree forward sits on
    m = span + 2 if 0 < span <= PROBE_SPAN_LIMIT else 2
    prefix = (torch.arange(m, device=dev) * 7 + 1) % vocab
    tree = DraftTree.from_lists([3 % vocab, 4 % vocab, 5 % vocab], [-1, -1, 1], dev).validate()
    with torch.no_grad():
        try:
            kv = KVBuffer.for_model(model, capacity=m + 6)
            out = run_model(model, kv, MaskBuffer(model.dtype, dev), verify_block(tree, m), verify_offsets(tree, m),
                            input_ids=torch.cat([prefix, tree.tokens])[None]).logits[0]
            # branch 2: prefix + node 1 + node 2 on its own, with the model's own causal mask, through the same
            # CPU kernels as the tree (verify/gqa.py): the probe compares masks, not Linear layouts (SmolLM2's
            # log-probs moved by 1.6e-3 between its own layout and the rows-first one at a 2-token prefix)
            with cpu_kernels(model):
                ref = model(input_ids=torch.cat([prefix, tree.tokens[1:]])[None]).logits[0, -3:]
            ok = tree_logits_agree(out[[m - 1, m + 1, m + 2]], ref, model.dtype)
        except Exception as err:  # noqa: BLE001 -- sorted by rejects_inputs; the rest is raised again
            if not rejects_inputs(err):
                raise
            ok = False
    model._draftkit_tree_ok = ok
    return ok


PROBE_SPAN_LIMIT = 8192  # windows up to this are probed past their edge (one forward of that many tokens, once)
