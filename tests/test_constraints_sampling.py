"""Sampling under a grammar or a logits processor follows the constrained target distribution (chi-square
against the exact joint of the 2nd and 3rd tokens)."""

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.verify.accept import Sampling
from draftkit.verify.decode import generate as _generate
from draftkit.verify.grammar import Grammar
from tests.models import tiny_model
from tests.test_sampled_trees import P_OK, chi2_pvalue

xgr = pytest.importorskip("xgrammar")

# ---- sampling follows the constrained target distribution ------------------------------------------
VE = 8
SMALL_VOCAB = ["<eos>", "a", "b", "c", "d", "e", "f", "g"]
SMALL_INFO = xgr.TokenizerInfo(SMALL_VOCAB, xgr.VocabType.RAW, stop_token_ids=[0])
SMALL_GRAMMAR = Grammar.regex("[abc][bdf][a-g]+")  # forbids about half of what an unconstrained draft proposes


def constrained_p(model, prompt, paths, processors, grammar) -> torch.Tensor:
    """(len(paths), VE) p after each path: the processors with input_ids = prompt + path, the grammar's mask
    after the path (from a matcher walked here), softmax at temperature 1."""
    seqs = torch.stack([torch.cat([prompt, torch.tensor(path, dtype=torch.long)]) for path in paths])
    with torch.no_grad():
        logits = model(input_ids=seqs).logits[:, -1].float()
    for proc in processors:
        logits = proc(seqs, logits)
    if grammar is not None:
        compiled = xgr.GrammarCompiler(SMALL_INFO).compile_regex(grammar.source)
        for row, path in enumerate(paths):
            matcher, mask = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, VE)
            if not all(matcher.accept_token(t) for t in path):
                mask.zero_()  # a path the grammar forbids: no p after it (weight 0 in the joint)
            else:
                matcher.fill_next_token_bitmask(mask)
            xgr.apply_token_bitmask_inplace(logits[row:row + 1], mask)
    return logits.softmax(-1)


def exact_tokens_2_3(model, prompt, processors, grammar) -> torch.Tensor:
    """P(t2, t3) of the 2nd and 3rd generated tokens under the constraint (t1 summed out), by brute force."""
    p1 = constrained_p(model, prompt, [[]], processors, grammar)[0]
    p2 = constrained_p(model, prompt, [[a] for a in range(VE)], processors, grammar)
    p3 = constrained_p(model, prompt, [[a, b] for a in range(VE) for b in range(VE)], processors, grammar)
    p3 = p3.nan_to_num(0.0).view(VE, VE, VE)  # paths the grammar forbids have no p: weight 0 anyway
    return (p1[:, None, None] * p2.nan_to_num(0.0)[:, :, None] * p3).sum(0)


@pytest.mark.parametrize("constraint, drafter", [("grammar", "standalone"),
                                                 pytest.param("processor", "standalone", marks=pytest.mark.slow),
                                                 pytest.param("grammar", "hybrid", marks=pytest.mark.slow)])
def test_sampling_under_a_constraint_follows_the_constrained_target(constraint, drafter):
    """A sampled standalone tree (q from an unconstrained draft, siblings without replacement) verified under a
    grammar (its forbidden nodes pruned, kept as leaves for the residual) or a repetition penalty: the 2nd and
    3rd tokens follow the constrained target's joint distribution. hybrid: two such drafters' trees merged (their
    draws kept per slot), pruned the same way."""
    from draftkit.drafters.hybrid import HybridDrafter

    torch.manual_seed(0)
    target = tiny_model("llama", vocab=VE, hidden=16, layers=1, seed=3)
    small = tiny_model("llama", vocab=VE, hidden=16, layers=1, seed=9)
    with torch.no_grad():  # a peaked target, on which a penalty taken at the wrong prefix shows (TV 0.10)
        target.get_output_embeddings().weight.mul_(3.0)
    prompt = torch.tensor([1, 1, 1, 1, 1])
    procs = [RepetitionPenaltyLogitsProcessor(3.0)] if constraint == "processor" else []
    grammar = SMALL_GRAMMAR if constraint == "grammar" else None
    exact = exact_tokens_2_3(target, prompt, procs, grammar)
    other = tiny_model("llama", vocab=VE, hidden=16, layers=1, seed=11)
    drafter = StandaloneDrafter(small, max_depth=2, top_k=4, max_nodes=8) if drafter == "standalone" else \
        HybridDrafter([("a", StandaloneDrafter(small, max_depth=2, top_k=3, max_nodes=6)),
                       ("b", StandaloneDrafter(other, max_depth=2, top_k=3, max_nodes=6))])
    counts, accepted, pruned = torch.zeros(VE, VE), 0, 0
    for i in range(800):
        out = _generate(target, prompt, drafter, max_new_tokens=4, sampling=Sampling(temperature=1.0), seed=i,
                        eos_token_id=[0] if grammar else [], budget="fixed", grammar=grammar, tokenizer=SMALL_INFO,
                        logits_processor=procs)
        t = out.tokens.tolist()
        counts[t[1], t[2]] += 1
        accepted += sum(s.accepted for s in out.stats.steps)
        pruned += out.stats.pruned_nodes
    assert accepted > 200 and (pruned > 300 or grammar is None)  # drafts are accepted, and pruned
    support = exact > 0
    assert counts[~support].sum() == 0  # nothing the constraint forbids was ever generated
    assert chi2_pvalue(counts[support], exact[support]) > P_OK, (counts, exact)
