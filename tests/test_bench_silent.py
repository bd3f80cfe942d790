"""eval/bench_silent.py: flags fail in one line before any model loads; the silent row drafts nothing while its
drafter still follows the text; the paired figure is the median ratio."""
from __future__ import annotations

import pytest
import torch

import draftkit as dk
from draftkit.drafters.suffix import SuffixDrafter
from draftkit.eval import bench_silent
from tests.models import tiny_model


@pytest.mark.parametrize("argv, word", [(["--drafters", "suffix,nosuch"], "nosuch"), (["--tasks", "cod"], "cod"),
                                        (["--rounds", "0"], "--rounds"), (["--temperature", "0"], "--temperature")])
def test_bad_flags_stop_with_one_line(argv, word, capsys):
    with pytest.raises(SystemExit) as err:
        bench_silent.parse(argv)
    assert err.value.code == 2
    assert word in capsys.readouterr().err.strip().splitlines()[-1]


def test_paired_is_the_median_of_plain_over_row_with_an_interval_around_it():
    plain = [1.0, 2.0, 3.0, 4.0, 5.0]
    row = [1.0, 2.5, 3.0, 4.0, 10.0]  # ratios 1, 0.8, 1, 1, 0.5
    mid, lo, hi = bench_silent.paired(plain, row)
    assert mid == pytest.approx(1.0) and lo <= mid <= hi and lo >= 0.5 and hi <= 1.0


def test_the_silent_row_drafts_nothing_and_its_drafter_still_follows_the_text():
    model = tiny_model()
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7])  # repeats: suffix would draft here
    drafter = SuffixDrafter(use_global=False)
    out = dk.generate(model, prompt, drafter, max_new_tokens=12, sampling=dk.Sampling(temperature=0.8), seed=0,
                      eos_token_id=[], budget=bench_silent.Silent(drafter.budget_cap))
    assert all(s.drafted == 0 for s in out.stats.steps)
    plain = dk.generate(model, prompt, None, max_new_tokens=12, sampling=dk.Sampling(temperature=0.8), seed=0,
                        eos_token_id=[])
    assert out.tokens.tolist() == plain.tokens.tolist()  # plain steps: the same draws as plain decoding
    seen = drafter.tokens  # what its updates told it (the last step's tokens are not handed to it)
    assert prompt.numel() < len(seen) and seen == out.sequence.tolist()[:len(seen)]
