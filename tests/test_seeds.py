"""One seed reproduces a sampled run: the drafter's draws (DecodeState.generator) and the verifier's come from
the seed given to generate, for every drafter, under budget="fixed" (a timing-driven budget changes the tree)."""
import pytest
import torch

import draftkit as dk

SAMPLING = dk.Sampling(temperature=0.7, top_p=0.9)
NEW = 12


@pytest.fixture(scope="module")
def target_and_prompts():
    target, tok = dk.load_target()
    texts = ["def add(a, b):\n    return", "class Stack:\n    def push(self,"]
    return target, [tok(t).input_ids for t in texts]


def sampled(target, drafter, prompt, seed: int) -> list[int]:
    torch.seed()  # reseed torch's global generator at random: a draw taken from it would differ run to run
    out = dk.generate(target, prompt, drafter, max_new_tokens=NEW, sampling=SAMPLING, seed=seed, budget="fixed",
                      eos_token_id=[])
    return out.tokens.tolist()


def drafter_for(name: str, target):
    """The shipped drafter, or for a one-forward drafter the zoo does not hold a randomly initialised draft."""
    from draftkit.zoo import available

    torch.manual_seed(0)
    if name in available():
        return dk.make_drafter(name, target)
    if name == "peagle":
        from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft

        return PEagleDrafter(target, make_peagle_draft(target, [2, 12, 21], 0))
    if name == "dflash":
        from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft

        return DFlashDrafter(target, make_dflash_draft(target, 5, 0, 1))
    return dk.make_drafter(name, target)


@pytest.mark.parametrize("name", sorted({*dk.DRAFTERS, "eagle-chain", "plain"}))
def test_the_same_seed_reproduces_every_drafter(target_and_prompts, name):
    target, prompts = target_and_prompts
    def run(seed):  # a fresh drafter each time: suffix also drafts from the requests it has seen
        drafter = drafter_for(name, target)
        return [sampled(target, drafter, p, seed) for p in prompts]

    runs = [run(3) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2], name
    other = run(4)
    assert other != runs[0], f"{name}: seeds 3 and 4 gave the same outputs on every prompt"


def test_the_drafters_draws_follow_the_seed_not_only_the_verifiers(target_and_prompts):
    """Twice with one seed: the sampled trees themselves are identical, draw for draw."""
    target, prompts = target_and_prompts
    seen = []
    for _ in range(2):
        drafter, trees = dk.make_drafter("eagle", target), []
        propose = drafter.propose

        def record(state, propose=propose, trees=trees):
            tree = propose(state)
            trees.append(tree.host_tokens)
            return tree

        drafter.propose = record
        sampled(target, drafter, prompts[0], seed=5)
        seen.append(trees)
    assert seen[0] == seen[1] and any(len(t) > 1 for t in seen[0])


def test_batches_and_best_of_n_are_reproducible(target_and_prompts):
    target, prompts = target_and_prompts

    def batch(seed):
        outs = dk.generate_batch(target, prompts, "standalone", max_new_tokens=NEW, sampling=SAMPLING, seed=seed,
                                 eos_token_id=[], budget="fixed")
        return [o.tokens.tolist() for o in outs]

    assert batch(3) == batch(3) and batch(3) != batch(4)
    best = [dk.best_of_n(target, prompts[0], 3, drafter="eagle", max_new_tokens=NEW, seed=3, eos_token_id=[],
                         budget="fixed") for _ in range(2)]
    assert [s.tokens.tolist() for s in best[0].samples] == [s.tokens.tolist() for s in best[1].samples]


def test_a_drafter_seed_is_refused_with_where_the_seed_goes(target_and_prompts):
    target, _ = target_and_prompts
    with pytest.raises(ValueError, match="pass seed= to generate"):
        dk.make_drafter("eagle", target, seed=3)


def test_the_hybrid_reproduces_whatever_its_members_timings(target_and_prompts, monkeypatch):
    """The hybrid judges on measured timings which members pay; under a fixed budget it must not (a member that
    looks slow changes nothing). A fresh hybrid reproduces (forget() clears its members' memory, not its
    calibration)."""
    import types

    import draftkit.drafters.hybrid as hybrid

    target, prompts = target_and_prompts

    def run(drafter):
        return [dk.generate(target, p, drafter, max_new_tokens=32, sampling=SAMPLING, seed=3, budget="fixed",
                            eos_token_id=[]).tokens.tolist() for p in prompts]

    first = run(dk.make_drafter("hybrid", target))
    assert run(dk.make_drafter("hybrid", target)) == first
    clock = [0.0]  # a clock on which the EAGLE member's drafting takes 100 s: it never pays on timings
    monkeypatch.setattr(hybrid, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    slow = dk.make_drafter("hybrid", target)
    member = next(m for m in slow.members if m.name == "eagle").drafter
    propose = member.propose

    def slow_propose(state):
        clock[0] += 100.0
        return propose(state)

    member.propose = slow_propose
    assert run(slow) == first
    assert all(m.asked > 4 for m in slow.members)  # judged over many steps, every member still asked
