"""eval/busy.py: the command runs beside the load, its exit code comes back, and the load is gone after."""
from __future__ import annotations

import subprocess
import sys

import pytest

from draftkit.eval import busy


def test_runs_the_command_beside_the_load_and_stops_it(tmp_path):
    probe = tmp_path / "seen.txt"
    code = ("import os, sys, subprocess; out = subprocess.run(['ps', '-o', 'args=', '--ppid', str(os.getppid())], "
            f"capture_output=True, text=True).stdout; open({str(probe)!r}, 'w').write(out); sys.exit(3)")
    assert busy.main(["--cores", "1", "--", sys.executable, "-c", code]) == 3
    assert busy.SPIN in probe.read_text()  # the spinning sibling ran while the command did
    after = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    assert busy.SPIN not in after


@pytest.mark.parametrize("argv, word", [(["--cores", "0", "--", "true"], "--cores"), ([], "command"),
                                        (["--cores", "999", "--", "true"], "--cores")])
def test_bad_flags_stop_with_one_line(argv, word, capsys):
    with pytest.raises(SystemExit) as err:
        busy.parse(argv)
    assert err.value.code == 2 and word in capsys.readouterr().err.strip().splitlines()[-1]
