# SPDX-License-Identifier: Apache-2.0
"""The package README's examples run: every ``python`` block of README.md, in
order, in one namespace (later blocks use the arrays of the first), against
the library the suite uses. The installed-wheel test (python_installed.py)
runs the first block only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_python_block_runs(capsys: Any) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 3, "the quickstart, the content checks and the merge"
    namespace: Dict[str, Any] = {"__name__": "__readme__"}
    for index, block in enumerate(blocks):
        exec(compile(block, f"{README} (python block {index})", "exec"), namespace)
    assert "invalid length: seq_lens[1] must be in [0, 512]" in capsys.readouterr().out
