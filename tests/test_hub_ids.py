"""A hub id that is neither a folder, nor in the local hub cache, nor reachable is one line within seconds, for
training (resolve_model), compare.py and the API, and nothing is created. The hub is made unreachable by
HF_HUB_OFFLINE or by pointing it at a local port nobody listens on."""
import socket
import time

import pytest

import draftkit as dk
from draftkit.eval import compare
from draftkit.models import ModelUnreachable
from draftkit.train.config import TrainError, resolve_model

MISSING = "someorg/nosuchmodel"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: a connection there is refused at once


@pytest.fixture(params=["offline", "no network"])
def unreachable_hub(request, monkeypatch):
    from huggingface_hub import constants

    if request.param == "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        return "HF_HUB_OFFLINE is set"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    return "did not answer within 2 s"


def test_training_names_an_unreachable_hub_id(unreachable_hub):
    t0 = time.perf_counter()
    with pytest.raises(TrainError, match=f"--target {MISSING}: neither a folder nor .*{unreachable_hub}"):
        resolve_model(MISSING, "target")
    assert time.perf_counter() - t0 < 5


def test_compare_names_an_unreachable_hub_id_and_creates_nothing(unreachable_hub, tmp_path, capsys):
    out = tmp_path / "results"
    assert compare.main(["--target", MISSING, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--target {MISSING}: neither a folder" in err and unreachable_hub in err
    assert not out.exists()


def test_the_api_names_an_unreachable_hub_id(unreachable_hub):
    with pytest.raises(ModelUnreachable, match=f"{MISSING}: neither a folder nor .*{unreachable_hub}"):
        dk.load_target(MISSING)


def test_a_hub_id_in_the_local_cache_needs_no_network(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from draftkit import models

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: str(tmp_path / name))
    assert models.hub_problem(MISSING) is None


def test_a_mistyped_folder_is_named_as_one(tmp_path):
    """A path that does not exist is not handed to the hub (whose error is "Repo id must use alphanumeric ...")."""
    for name in (str(tmp_path / "no" / "such" / "model"), "./not-here/model/x"):
        with pytest.raises(ModelUnreachable, match="no such folder, and not a hub id"):
            dk.load_target(name)
