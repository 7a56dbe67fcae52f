"""The package as users get it: public names, import weight, both install modes, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import waypoint.engine as engine

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = {
    "Graph", "CompiledGraph", "START", "END", "Lambda", "Component", "RetryPolicy", "Event",
    "register_merge", "register_concat", "Interrupt", "StatefulInterrupt", "CompositeInterrupt",
    "InterruptCtx", "InterruptInfo", "WaypointError", "GraphBuildError", "GraphRunError", "NodeError",
    "MaxStepsExceeded", "MaxIterationsExceeded", "GraphInterrupted", "GraphMismatch", "CheckpointError",
    "CheckpointConflict", "CheckpointExists", "CheckpointNotFound", "CheckpointCorrupted",
    "UnknownInterrupt", "SerializationError", "register_type", "Serializer", "UnsupportedFormat", "UnknownType",
    "get_interrupt_state", "get_resume_context", "CheckPointStore", "RunSnapshot",
    "Workflow", "WorkflowNode", "FieldMapping", "from_field", "to_field", "map_fields", "Update", "append", "add_messages",
}


def test_engine_all_is_curated():
    assert PUBLIC <= set(engine.__all__)
    for name in engine.__all__:
        assert hasattr(engine, name), name


def test_importing_the_engine_stays_light():
    code = (
        "import sys, json, time; t = time.perf_counter(); import waypoint.engine; "
        "print(json.dumps({'ms': (time.perf_counter() - t) * 1000, "
        "'heavy': sorted(m for m in ('sqlalchemy', 'openai', 'aiosqlite', 'waypoint.stores', "
        "'waypoint.middleware', 'waypoint.service', 'waypoint.cmd', 'fastapi', 'starlette', 'uvicorn', "
        "'opentelemetry', 'mcp', 'anthropic', 'httpx2') "
        "if m in sys.modules)}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    result = json.loads(out.stdout)
    assert result["heavy"] == []


EXTRAS = {"opentelemetry": "otel", "mcp": "mcp", "anthropic": "anthropic"}


def test_the_ecosystem_extras_load_only_when_named():
    """`[otel]`, `[mcp]`, `[anthropic]`: importing the packages that offer them loads none of them (each takes
    60-700 ms to import); naming the class does (the `mcp` SDK waits for the first connection)."""
    code = (
        "import sys, json\n"
        "import waypoint.engine, waypoint.engine.models, waypoint.engine.tools, waypoint.middleware\n"
        "from waypoint.engine import ChatModelAgent, Runner, tool\n"
        f"heavy = {sorted(EXTRAS)!r}\n"
        "before = [m for m in heavy if m in sys.modules]\n"
        "from waypoint.middleware import OTelTracing\n"
        "from waypoint.engine.tools import MCPServerStdio\n"
        "MCPServerStdio('true')\n"
        "from waypoint.engine.models import AnthropicChatModel\n"
        "AnthropicChatModel('m', base_url='http://127.0.0.1:9', api_key='k')\n"
        "print(json.dumps({'before': before, 'after': [m for m in heavy if m in sys.modules]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"before": [], "after": ["anthropic", "opentelemetry"]}


def test_make_test_installs_what_the_extras_tests_need():
    """CI runs `make test`, which installs `.[dev]`: every ecosystem extra's requirements must be in it."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in set(EXTRAS.values()):
        assert extras[extra] and set(extras[extra]) <= set(extras["dev"]), extra


def test_engine_does_not_import_outer_layers():
    for path in (ROOT / "engine").rglob("*.py"):
        text = path.read_text()
        for layer in ("waypoint.stores", "waypoint.middleware", "waypoint.service", "waypoint.cmd"):
            assert f"import {layer}" not in text and f"from {layer}" not in text, (path, layer)


def test_only_the_cli_imports_the_service():
    """`cmd -> service -> {middleware, stores, engine}`: the service is the outermost layer but the CLI."""
    for folder in ("engine", "stores", "middleware"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "waypoint.service" not in text and "fastapi" not in text, path
    for path in (ROOT / "service").rglob("*.py"):
        text = path.read_text()
        assert "waypoint.cmd" not in text and "from .." not in text, path


def test_cli_demo_runs(tmp_path):
    # A fresh directory: the demo keeps its database under ./.waypoint/, nowhere else.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    waypoint = str(Path(sys.executable).parent / "waypoint")
    out = subprocess.run([waypoint, "demo"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "offline model" in out.stdout  # it says which model answered
    approval = lines.index("   ⚠️  Approval Required ⚠️")
    assert lines[approval + 1:approval + 3] == ["   Tool: execute", '   Arguments: {"command": "echo hello from waypoint"}']
    assert "   [tool result] hello from waypoint" in lines[approval:]  # ran after the approval, in process B
    assert any("process B claims the paused run" in line for line in lines)
    assert "flowchart TD" in out.stdout and "\033[" not in out.stdout  # not a terminal: no colour codes
    assert (tmp_path / ".waypoint" / "demo.db").exists()
    triage = subprocess.run([waypoint, "demo", "--triage"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert triage.returncode == 0 and "Escalated 'The site is down!'" in triage.stdout, triage.stderr


@pytest.mark.parametrize("editable", [False, True], ids=["pip-install", "pip-install-e"])
def test_pip_install_works_and_installs_no_bare_modules(tmp_path, editable):
    """Install into a fresh venv (dependencies borrowed from this one) and import from elsewhere."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    src = tmp_path / "src"  # a copy of the working tree, as a clean checkout would have it
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "*.egg-info", "build", ".waypoint", ".pytest_cache", ".hypothesis"))
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
           "--no-deps"]
    cmd += ["-e", str(src)] if editable else [str(src)]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    # pip shows the build backend's warnings; a fresh machine's setuptools must find nothing deprecated
    # (the license used to be a TOML table, which setuptools >= 77 warns about).
    assert "deprecat" not in (res.stdout + res.stderr).lower(), res.stderr[-2000:]
    probe = (
        "import importlib.util, importlib.resources, waypoint.engine, waypoint.stores, waypoint.middleware, waypoint.cmd;"
        "import waypoint.service;"
        "assert 'Approve' in importlib.resources.files('waypoint.service').joinpath('ui', 'app.js').read_text();"
        "from waypoint.engine import Graph, START, END;"
        "g = Graph(name='p'); g.add_node('a', lambda x: x * 2); g.add_edge(START, 'a'); g.add_edge('a', END);"
        "print(g.compile().invoke(21), importlib.util.find_spec('engine') is None,"
        " importlib.util.find_spec('stores') is None, __import__('cmd').__file__)"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    value, no_engine, no_stores, cmd_file = out.stdout.split()
    assert (value, no_engine, no_stores) == ("42", "True", "True")
    assert "/lib/python3" in cmd_file  # `cmd` is still the standard library's
    assert (venv / "bin" / "waypoint").exists()


def test_python_m_pytest_runs_from_the_repository_root():
    """`python -m` puts the root first on sys.path, where `cmd/` would shadow the standard library's
    `cmd` (pdb imports it, pytest imports pdb): tests/conftest.py imports the real one first."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/test_package.py"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "test_python_m_pytest_runs_from_the_repository_root" in out.stdout


def test_the_cli_passes_options_before_a_commands_words_to_that_command(tmp_path):
    waypoint = str(Path(sys.executable).parent / "waypoint")
    out = subprocess.run([waypoint, "runs", "--db", str(tmp_path / "none.db"), "list"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "invalid choice" not in out.stderr and "none.db" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "none.db").exists()


def test_engine_imports_run_downhill_in_the_order_the_architecture_page_lists():
    """docs/architecture.md lists the core's modules bottom-up; each imports only modules listed before it
    (modules it does not list — the codec, small leaf helpers — are not ordered)."""
    import ast
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.search(r"in this order — (.*?) —", text, re.S)
    order = re.findall(r"`(\w+)`", listed.group(1))
    place = {name: i for i, name in enumerate(order)}
    for name in order:
        tree = ast.parse((ROOT / "engine" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                dep = node.module.split(".")[0]
                assert place.get(dep, -1) < place[name], f"engine/{name}.py imports {dep}, listed above it"
