"""The code in README.md and docs/ runs and prints what its comments say (```python blocks;
illustrative fragments are marked ```py and are not run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [(doc.name, code) for doc in DOCS for code in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)]


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[f"{name}-{i}" for i, (name, _) in enumerate(BLOCKS)])
def test_doc_block_runs_and_prints_what_it_says(code, tmp_path):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    promised = [m.strip() for m in re.findall(r"print\(.*\)\s+# (.*)", code)]
    assert out.stdout.splitlines() == promised


def test_docs_link_to_existing_files():
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_the_api_reference_covers_every_public_name_and_option():
    """docs/api.md is derived from the code: a public name or option added later must be added there."""
    import inspect

    import waypoint.engine as engine
    import waypoint.stores as stores
    from waypoint.engine.graph import Graph
    from waypoint.engine.lifecycle import RunOptions

    text = (ROOT / "docs" / "api.md").read_text()
    names = [*engine.__all__, *stores.__all__]
    names += [p for p in inspect.signature(Graph.compile).parameters if p != "self"]
    names += list(RunOptions.__dataclass_fields__)
    missing = [name for name in names if not re.search(rf"\b{name}\b", text)]
    assert missing == [], f"docs/api.md does not mention {missing}"
