"""Constraints under speculation (verify/constraints.py, verify/grammar.py): grammars and logits processors
applied at every tree node keep greedy output identical to plain constrained decoding, to an independent
token-by-token reference, and to transformers' generate with the same processors; pruning and jump-forward
on a grammar whose forced tokens are known; bad input fails with one line."""
import json
import re

import pytest
import torch
from transformers import (LogitsProcessorList, MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor,
                          NoRepeatNGramLogitsProcessor, PrefixConstrainedLogitsProcessor,
                          RepetitionPenaltyLogitsProcessor)

from draftkit.drafters.lookahead import LookaheadDrafter
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.verify.contract import DraftTree
from draftkit.verify.decode import generate as _generate
from draftkit.verify.grammar import Grammar, GrammarError
from tests.models import tiny_model

xgr = pytest.importorskip("xgrammar")

# a 64-token vocabulary of characters and a few multi-character pieces; token 0 ends the sequence
VOCAB = (["<eos>", "{", "}", '"', ":", ",", " ", "[", "]"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
         + [str(d) for d in range(10)] + ['{"', '":', '",', '"}', "ab", "true", "false", "null", "cd", "xy", "12",
                                          ", ", ": ", "-", "(", ")", "+", "*", "="])
assert len(VOCAB) == 64
INFO = xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, stop_token_ids=[0])
EOS = [0]

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["ab", "xyz"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "name": {"type": "string", "maxLength": 4}},
          "required": ["ok", "kind", "n", "name"], "additionalProperties": False}
GRAMMARS = {
    "json": (Grammar.json_schema(SCHEMA, any_whitespace=False), lambda text: json.loads(text)),
    "regex": (Grammar.regex(r"(ab|cd){1,3}-[0-9]{2}x?"), lambda text: re.fullmatch(r"(ab|cd){1,3}-[0-9]{2}x?", text)),
    "ebnf": (Grammar.ebnf('root ::= "(" item ("," item){0,3} ")"\nitem ::= "a" | "bc" | [0-9] [0-9]?'),
             lambda text: re.fullmatch(r"\((a|bc|[0-9][0-9]?)(,(a|bc|[0-9][0-9]?)){0,3}\)", text)),
}


def generate(*args, **kwargs):
    """The loop with the drafter's fixed cap every step (drafting under the constraint is under test)."""
    return _generate(*args, **{"budget": "fixed", "eos_token_id": EOS, **kwargs})


def decode(ids) -> str:
    return "".join(VOCAB[t] for t in ids if t != 0)


def drafters(target, small):
    return {
        "standalone-tree": lambda: StandaloneDrafter(small, max_depth=4, top_k=3, max_nodes=12),
        "self-chain": lambda: StandaloneDrafter(target, max_depth=5),  # accepts everything the grammar allows
        "self-tree": lambda: StandaloneDrafter(target, max_depth=4, top_k=3, max_nodes=12),
        "lookahead": lambda: LookaheadDrafter(),
    }


def reference(model, prompt, grammar: Grammar, n: int) -> list[int]:
    """Independent constrained greedy decoding: the full sequence through the model each step, the grammar's
    bitmask from a matcher compiled here, argmax."""
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, stop_token_ids=EOS))
    compiled = {"json_schema": lambda: compiled.compile_json_schema(grammar.source,
                                                                    any_whitespace=grammar.any_whitespace),
                "regex": lambda: compiled.compile_regex(grammar.source),
                "ebnf": lambda: compiled.compile_grammar(grammar.source)}[grammar.kind]()
    matcher, mask = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, 64)
    seq, out = prompt.tolist(), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[:, -1].float()
            matcher.fill_next_token_bitmask(mask)
            xgr.apply_token_bitmask_inplace(logits, mask)
            t = int(logits.argmax())
            out.append(t)
            seq.append(t)
            if t in EOS:
                break
            assert matcher.accept_token(t)
    return out


@pytest.fixture(scope="module")
def models():
    return tiny_model("llama", seed=0), tiny_model("llama", hidden=16, layers=1, seed=1)


@pytest.mark.parametrize("kind", list(GRAMMARS))
def test_every_drafter_under_a_grammar_equals_plain_constrained_decoding(models, kind):
    target, small = models
    grammar, valid = GRAMMARS[kind]
    for seed in range(2):
        prompt = torch.randint(1, 64, (3 + 4 * seed,), generator=torch.Generator().manual_seed(seed))
        plain = generate(target, prompt, max_new_tokens=48, grammar=grammar, tokenizer=INFO)
        assert plain.tokens.tolist() == reference(target, prompt, grammar, 48), (kind, seed)
        assert plain.stats.grammar_complete == (plain.tokens.tolist()[-1] == 0)  # an EOS ends only a complete one
        if plain.stats.grammar_complete:
            assert plain.tokens.tolist()[-1] == 0 and valid(decode(plain.tokens.tolist())), decode(plain.tokens)
        else:  # max_new_tokens ended it first, and the stats say so
            assert plain.tokens.numel() == 48
        for name, make in drafters(target, small).items():
            out = generate(target, prompt, drafter=make(), max_new_tokens=48, grammar=grammar, tokenizer=INFO)
            assert out.tokens.tolist() == plain.tokens.tolist(), (kind, name, seed)
            assert out.stats.grammar_complete == plain.stats.grammar_complete


def test_every_grammar_output_completes_and_parses(models):
    """With room enough, each grammar completes on these prompts and its text parses / matches."""
    target, _ = models
    done = 0
    for kind, (grammar, valid) in GRAMMARS.items():
        for seed in range(3):
            prompt = torch.randint(1, 64, (4,), generator=torch.Generator().manual_seed(10 + seed))
            out = generate(target, prompt, max_new_tokens=120, grammar=grammar, tokenizer=INFO)
            if out.stats.grammar_complete:
                done += 1
                assert valid(decode(out.tokens.tolist())), (kind, decode(out.tokens.tolist()))
    assert done >= 6  # most runs complete: the check above really ran


# ---- pruning and jump-forward on a grammar whose forced tokens are known ---------------------------
class FixedTree:
    """Proposes one fixed tree at every step (tokens by their text)."""

    hidden_layers = ()

    def __init__(self, pieces, parents):
        self.tokens, self.parents = [VOCAB.index(p) for p in pieces], parents

    def reset(self, prompt):
        pass

    def propose(self, state):
        return DraftTree.from_lists(self.tokens, self.parents)

    def update(self, result):
        self.last = result


def test_forbidden_nodes_are_pruned_and_forced_tokens_jump_forward(models):
    """Grammar "kmo" ("0" | "1") "pgh" (no vocabulary piece spans two of its letters): after the prefill's "k",
    "m" and "o" are forced; after the digit, "p", "g", "h" and then EOS. The tree offers "q" (forbidden, with a
    child) and both digits."""
    target, _ = models
    grammar = Grammar.ebnf('root ::= "k" "m" "o" ("0" | "1") "p" "g" "h"')
    drafter = FixedTree(["q", "r", "0", "1", "p"], [-1, 0, -1, -1, 2])
    out = generate(target, torch.tensor([5, 6, 7]), drafter=drafter, max_new_tokens=20, grammar=grammar,
                   tokenizer=INFO)
    text = decode(out.tokens.tolist())
    assert re.fullmatch("kmo[01]pgh", text) and out.tokens.tolist()[-1] == 0
    prefill, step = out.stats.steps
    assert (prefill.committed, prefill.forced) == (3, 2)  # k, then m o forced
    assert step.pruned == 2 and step.drafted == 3  # q and its child r never reach the forward
    assert step.forced == 4 - step.accepted  # p g h EOS, less what the tree already held (p under 0)
    assert out.stats.forced_tokens == 2 + step.forced and out.stats.pruned_nodes == 2
    assert out.stats.tau_with_forced == step.accepted + 1 + step.forced
    assert out.stats.grammar_complete is True
    assert drafter.last.accepted == ([2, 4] if text[3] == "0" else [3])  # the drafter's own node indices
    plain = generate(target, torch.tensor([5, 6, 7]), max_new_tokens=20, grammar=grammar, tokenizer=INFO)
    assert plain.tokens.tolist() == out.tokens.tolist() and plain.stats.forced_tokens == 6
    off = generate(target, torch.tensor([5, 6, 7]), max_new_tokens=20, grammar=grammar, tokenizer=INFO,
                   jump_forward=False)
    assert off.tokens.tolist() == out.tokens.tolist() and off.stats.forced_tokens == 0
    assert len(off.stats.steps) == len(out.tokens)  # one forward per token without jump-forward


def test_max_new_tokens_before_the_grammar_completes_is_recorded(models):
    target, _ = models
    grammar = Grammar.ebnf('root ::= "k" "m" "o" ("0" | "1") "p" "g" "h"')
    out = generate(target, torch.tensor([5, 6, 7]), max_new_tokens=5, grammar=grammar, tokenizer=INFO)
    assert decode(out.tokens.tolist()).startswith("kmo") and out.tokens.numel() == 5
    assert out.stats.grammar_complete is False and out.stats.summary()["grammar_complete"] is False


# ---- logits processors against transformers' generate ---------------------------------------------
def hf_generate(model, prompt, n, processors, eos):
    out = model.generate(prompt[None], max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0,
                         logits_processor=LogitsProcessorList(processors))
    return out[0, prompt.numel():].tolist()


def processor_sets(prompt_len, free):
    """name -> (processors, EOS token or None). free: plain decoding's output; its 4th token is made the EOS that
    min-new-tokens must hold back, and some of its tokens are the bad words."""
    return {
        "repetition": ([RepetitionPenaltyLogitsProcessor(3.0)], None),
        "no-repeat-3gram": ([NoRepeatNGramLogitsProcessor(3)], None),
        "min-new-tokens": ([MinNewTokensLengthLogitsProcessor(prompt_len, 12, free[3])], free[3]),
        "bad-words+repetition": ([NoBadWordsLogitsProcessor([[free[1]], [free[4], free[5]]]),
                                  RepetitionPenaltyLogitsProcessor(1.3)],
                                 None),
    }


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_processors_equal_transformers_generate_for_every_drafter(arch):
    target = tiny_model(arch, seed=0)
    small = tiny_model(arch, hidden=16, layers=1, seed=1)
    changed = set()
    for seed in range(2):
        prompt = torch.randint(1, 64, (5 + 3 * seed,), generator=torch.Generator().manual_seed(seed))
        free = _generate(target, prompt, max_new_tokens=30, eos_token_id=[]).tokens.tolist()
        for name, (procs, eos) in processor_sets(prompt.numel(), free).items():
            ref = hf_generate(target, prompt, 30, procs, eos)
            if ref != hf_generate(target, prompt, 30, [], eos):
                changed.add(name)
            for dname, make in {"plain": lambda: None, **drafters(target, small)}.items():
                out = generate(target, prompt, drafter=make(), max_new_tokens=30, eos_token_id=[] if eos is None
                               else [eos], logits_processor=LogitsProcessorList(procs))
                assert out.tokens.tolist() == ref, (arch, name, dname, seed)
    assert changed == set(processor_sets(1, free)), changed  # every list changed some output: the test can fail


def test_processors_and_grammar_together(models):
    target, small = models
    grammar, valid = GRAMMARS["ebnf"]
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(2.0), NoRepeatNGramLogitsProcessor(2)])
    prompt = torch.tensor([3, 4, 5, 6])
    plain = generate(target, prompt, max_new_tokens=40, grammar=grammar, tokenizer=INFO, logits_processor=procs)
    for make in drafters(target, small).values():
        out = generate(target, prompt, drafter=make(), max_new_tokens=40, grammar=grammar, tokenizer=INFO,
                       logits_processor=procs)
        assert out.tokens.tolist() == plain.tokens.tolist()


# ---- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, words", [
    (lambda: Grammar.regex("(ab"), "regex: Regex parsing error"),
    (lambda: Grammar.ebnf("root ::= foo"), 'ebnf: EBNF parser error at line 1, column 10: Rule "foo" is not defined'),
    (lambda: Grammar.json_schema("{not json"), "JSON schema: invalid JSON"),
    (lambda: Grammar.json_schema({"type": "bogus"}), 'json schema: Unsupported type "bogus"'),
    (lambda: Grammar.json_schema({"type": "string", "not": {"maxLength": 2}}), "$.not is not supported"),
    (lambda: Grammar.json_schema([1, 2]), "must be a JSON object"),
    (lambda: Grammar.regex(""), "the regex is empty"),
    (lambda: Grammar.from_spec("schema.yaml"), "pass a .json schema file"),
    (lambda: Grammar.from_spec("missing.json"), "cannot read it"),
])
def test_bad_grammars_fail_with_one_line(make, words):
    with pytest.raises(GrammarError) as err:
        make()
    assert words in str(err.value) and "\n" not in str(err.value)


def test_unusable_grammars_and_processors_are_refused_before_decoding(models):
    target, _ = models
    prompt = torch.tensor([1, 2, 3])
    with pytest.raises(GrammarError, match="no token of this vocabulary can start it"):
        generate(target, prompt, grammar=Grammar.regex("Q+"), tokenizer=INFO)
    with pytest.raises(GrammarError, match="needs the target's tokenizer"):
        generate(target, prompt, grammar=Grammar.regex("ab"))
    with pytest.raises(GrammarError, match="needs a stop token"):
        generate(target, prompt, grammar=Grammar.regex("ab"), tokenizer=INFO, eos_token_id=[])
    with pytest.raises(TypeError, match="a string could be a schema, a regex or a grammar"):
        generate(target, prompt, grammar="ab+", tokenizer=INFO)
    with pytest.raises(ValueError, match="PrefixConstrainedLogitsProcessor is not supported under speculation"):
        generate(target, prompt, logits_processor=[PrefixConstrainedLogitsProcessor(lambda b, ids: [1], 1)])


def test_a_processor_of_ones_own_opts_in():
    target = tiny_model("llama", seed=0)

    class BanFive:
        draftkit_rowwise = True

        def __call__(self, input_ids, scores):
            return scores.index_fill(1, torch.tensor([5]), float("-inf"))

    prompt = torch.tensor([1, 2, 3])
    out = generate(target, prompt, drafter=StandaloneDrafter(target, max_depth=3), max_new_tokens=20,
                   logits_processor=[BanFive()], eos_token_id=[])
    assert 5 not in out.tokens.tolist()
    assert out.tokens.tolist() == hf_generate(target, prompt, 20, [BanFive()], None)
    alone = generate(target, prompt, drafter=StandaloneDrafter(target, max_depth=3), max_new_tokens=20,
                     logits_processor=BanFive(), eos_token_id=[])  # one processor, not in a list
    assert alone.tokens.tolist() == out.tokens.tolist()


def test_a_batch_under_a_grammar_equals_each_row_alone(models):
    """generate_batch: one matcher per row; rows of different lengths accept and jump forward on their own."""
    import draftkit as dk

    target, small = models
    grammar, _ = GRAMMARS["json"]
    procs = [RepetitionPenaltyLogitsProcessor(1.5)]
    prompts = [torch.tensor([3, 4, 5]), torch.tensor([9, 8, 7, 6, 5, 4, 3]), torch.tensor([20])]
    alone = [generate(target, p, max_new_tokens=40, grammar=grammar, tokenizer=INFO, logits_processor=procs)
             for p in prompts]
    outs = dk.generate_batch(target, prompts, lambda: StandaloneDrafter(small, max_depth=4, top_k=2, max_nodes=8),
                             max_new_tokens=40, eos_token_id=EOS, budget="fixed", grammar=grammar, tokenizer=INFO,
                             logits_processor=procs)
    assert [o.tokens.tolist() for o in outs] == [a.tokens.tolist() for a in alone]
    assert [o.stats.grammar_complete for o in outs] == [a.stats.grammar_complete for a in alone]
    assert all(o.stats.forced_tokens for o in outs)


def test_hidden_state_drafters_after_forced_tokens():
    """A drafter that reads the target's hidden states (EAGLE, P-EAGLE, DFlash, Medusa) has none for forced tokens
    until the next forward feeds them: the step after a jump-forward drafts nothing (DFlash would refuse a root
    its context does not reach), and output stays exact."""
    from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft
    from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
    from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft
    from tests.parallel_common import tiny_target

    target = tiny_target(layers=4, seed=0, logit_scale=4.0)
    torch.manual_seed(1)
    makers = {"eagle": lambda: EagleDrafter(target, EagleDraftModel.from_target(target), max_depth=4, top_k=2,
                                            max_nodes=8),
              "peagle": lambda: PEagleDrafter(target, make_peagle_draft(target, [1, 2, 3], mask_token_id=5),
                                              max_depth=4, max_nodes=8, top_k=2),
              "dflash": lambda: DFlashDrafter(target, make_dflash_draft(target, block_size=5, mask_token_id=5,
                                                                       draft_layers=2, target_layers=[1, 3]),
                                              max_depth=4, max_nodes=8, top_k=2)}
    grammar, _ = GRAMMARS["json"]
    for seed in range(2):
        prompt = torch.randint(1, 64, (4 + seed,), generator=torch.Generator().manual_seed(seed))
        plain = generate(target, prompt, max_new_tokens=40, grammar=grammar, tokenizer=INFO)
        assert plain.stats.forced_tokens > 5
        for name, make in makers.items():
            out = generate(target, prompt, drafter=make(), max_new_tokens=40, grammar=grammar, tokenizer=INFO)
            assert out.tokens.tolist() == plain.tokens.tolist(), (name, seed)
            steps = out.stats.steps
            assert any(s.drafted + s.pruned for s in steps), name
            assert all(b.drafted + b.pruned == 0 for a, b in zip(steps, steps[1:]) if a.forced), name
