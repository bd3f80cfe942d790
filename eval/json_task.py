"""The json task: prompts asking for a JSON object of a schema the task ships, decoded under that schema.

The shipped models know Python code, so each prompt is the start of Python code that is about to
hold one JSON record (eval/prompts/person.schema.json). Every method, plain decoding (the
baseline: plain constrained decoding) included, decodes under the schema in compact layout
(any_whitespace=False: no free whitespace between JSON tokens, so the keys, quotes and
separators are forced tokens).
"""
from __future__ import annotations

import os

SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts", "person.schema.json")

PROMPTS = [
    "import json\n\n# one row of the users table\nrecord = json.loads('",
    "def test_parse_user():\n    raw = '",
    "USERS = [\n    # exported from the staff directory\n    json.loads('",
    "import json\n\n\ndef load_default_user():\n"
    "    \"\"\"The account created on first start.\"\"\"\n    return json.loads('",
    "class UserTests(unittest.TestCase):\n    def test_roundtrip(self):\n        text = '",
    "# fixtures/user.json holds one user:\nFIXTURE = '",
    "    def to_json(self):\n        # e.g. '",
    "response = client.post('/users', data='",
]


def json_grammar():
    from draftkit.verify.grammar import Grammar

    with open(SCHEMA_FILE, encoding="utf-8") as fh:
        return Grammar.json_schema(fh.read(), any_whitespace=False)


def json_prompts(tokenizer, n: int) -> list:
    """The first n prompts (cycled when n is larger), tokenized."""
    from draftkit.eval.tasks import Prompt

    return [Prompt("json", tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"], f"json#{i % len(PROMPTS)}")
            for i in range(n)]
