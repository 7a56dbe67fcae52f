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
    from waypoint.engine.compose.graph import Graph
    from waypoint.engine.keep.lifecycle import RunOptions

    text = (ROOT / "docs" / "api.md").read_text()
    names = [*engine.__all__, *stores.__all__]
    names += [p for p in inspect.signature(Graph.compile).parameters if p != "self"]
    names += list(RunOptions.__dataclass_fields__)
    missing = [name for name in names if not re.search(rf"\b{name}\b", text)]
    assert missing == [], f"docs/api.md does not mention {missing}"


def test_the_serve_example_of_service_md_runs_with_the_package_it_shows(tmp_path):
    """docs/service.md's `waypoint serve --agents myapp.agents:ops,myapp.flows:refunds`, from a directory holding the
    `myapp` the page shows (it used to name a package it never showed): it starts and prints the banner the page
    prints, but for the port."""
    pytest.importorskip("fastapi")
    import os

    from service_support import ServeProcess

    page = (ROOT / "docs" / "service.md").read_text()
    for block in re.findall(r"```py\n(.*?)```", page, re.S):
        name = re.match(r"# (myapp/\w+\.py)", block)
        if name:
            (tmp_path / name.group(1)).parent.mkdir(exist_ok=True)
            (tmp_path / name.group(1)).write_text("" if "(empty)" in block.splitlines()[0] else block)
    assert sorted(p.name for p in (tmp_path / "myapp").iterdir()) == ["__init__.py", "agents.py", "flows.py"]
    (command, banner), = re.findall(r"^(waypoint serve --db .*?)\s+# .*\n# (waypoint serve: .*)$", page, re.M)
    words = command.split()
    assert words[:5] == ["waypoint", "serve", "--db", "runs.db", "--agents"]
    served = ServeProcess(tmp_path, agents=words[5], db="runs.db",
                          env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    try:
        said = next(line for line in served.output if line.startswith("waypoint serve: http://"))
        assert said.rstrip("\n") == banner.replace(":8000/", f":{served.port}/")
    finally:
        served.stop()


def test_the_docs_mention_no_open_bug_or_xfail():
    """An open bug is an issue to fix, not a page to read (there is none: tests/ marks nothing xfail)."""
    tests = [p for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs.py"]
    assert not [p.name for p in tests if "xfail" in p.read_text()]
    for doc in DOCS:
        text = doc.read_text().lower()
        assert "xfail" not in text and "open bug" not in text and "known bug" not in text, doc.name
