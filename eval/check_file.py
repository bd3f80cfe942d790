"""A check's JSON file, written section by section (eval/gpu_check.py): a section that is "ok" is not run again, one
that fails records its error and the next one runs, none starts past the time budget, and a file written under
other settings is kept aside rather than counted as done."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

from draftkit.files import write_text_atomically


class Check:
    """The JSON file, section by section."""

    def __init__(self, path: Path, redo: set[str], budget_s: float, config: dict | None = None):
        """config: the settings the sections' results depend on; a file written under others is moved aside
        (<out>.previous.json, kept) and every section runs again, so no result of another setup is taken as done."""
        self.path, self.redo, self.deadline = path, redo, time.monotonic() + budget_s
        self.data = json.loads(path.read_text()) if path.exists() else {"sections": {}}
        config = config or {}
        old = self.data.get("config")
        if self.data["sections"] and old != config:
            aside = path.with_name(path.stem + ".previous.json")
            path.replace(aside)
            print(f"{path} holds sections run with other settings ({old} -> {config}): moved to {aside}; "
                  f"every section runs again")
            self.data = {"sections": {}}
        self.data["config"] = config

    def section(self, name: str, fn) -> None:
        old = self.data["sections"].get(name, {})
        if old.get("status") == "ok" and name not in self.redo:
            print(f"{name}: ok already, skipped")
            return
        if time.monotonic() > self.deadline:
            if old.get("status") != "ok":  # an earlier result is kept
                self.data["sections"][name] = {"status": "skipped", "error": "time budget (--budget-s) spent"}
            self.save()
            print(f"{name}: skipped, time budget spent")
            return
        t0 = time.monotonic()
        try:
            result, status, error = fn(), "ok", None
        except Exception as err:  # noqa: BLE001 -- recorded in the JSON; the next section still runs
            result, status, error = None, "failed", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=8)}"
        self.data["sections"][name] = {"status": status, "seconds": round(time.monotonic() - t0, 1),
                                       "result": result, "error": error}
        self.save()
        print(f"{name}: {status} in {time.monotonic() - t0:.1f} s" + (f"\n{error}" if error else ""))

    def save(self) -> None:
        write_text_atomically(self.path, json.dumps(self.data, indent=1, default=str))
