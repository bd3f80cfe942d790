"""verify/cost_profile.py: the verify cost curve is measured once per machine + model + context, said when a call
measures it, and read from the cache after."""


def test_a_measured_cost_profile_is_said_once_and_then_read_from_the_cache(tmp_path, monkeypatch, caplog):
    """The one call that measures the verify curve says so (a first call's time is not decoding speed); the next
    call reads the saved profile and says nothing."""
    import logging

    from draftkit.verify.cost_profile import CostProfile
    from tests.models import tiny_model

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    model = tiny_model("llama")
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        first = CostProfile.for_model(model, 40)
    assert len(caplog.records) == 1 and "verify cost curve" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        again = CostProfile.for_model(model, 40)
    assert not caplog.records and again.ratios == first.ratios
