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


def _engine_imports():
    """(importing file, its room, the engine module it imports, line) for every `from ... import` inside engine/."""
    import ast

    for path in sorted((ROOT / "engine").rglob("*.py")):
        rel = path.relative_to(ROOT / "engine")
        parts = list(rel.with_suffix("").parts)
        package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        room = parts[0] if len(parts) > 1 else None
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif (node.module or "").startswith("waypoint.engine"):
                target = node.module.split(".")[2:]
            else:
                continue
            yield rel, room, target, node.lineno


CORE_ROOMS = ("codec", "shape", "run", "keep", "compose")


def test_engine_rooms_import_only_downhill_and_through_each_others_faces():
    """docs/architecture.md lists the engine's rooms bottom up; a room imports only rooms listed before it (and
    `errors`, `events`), never the engine's own face, and a room of the core only through its face (`__init__.py`)."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    order = re.findall(r"`(\w+)`", re.search(r"in this order — (.*?) —", text, re.S).group(1))
    assert order and {p.name for p in (ROOT / "engine").iterdir() if p.is_dir() and p.name != "__pycache__"} == set(order)
    place = {room: i for i, room in enumerate(order)}
    loose = {p.name for p in (ROOT / "engine").glob("*.py")}
    assert loose == {"__init__.py", "errors.py", "events.py", "_moved.py"}, loose  # everything else is in a room
    for rel, room, target, line in _engine_imports():
        if room is None or not target or target[0] in ("errors", "events") or target[0] == room:
            assert target or room is None, f"engine/{rel}:{line} imports the engine's face from inside a room"
            continue
        where = f"engine/{rel}:{line} imports engine.{'.'.join(target)}"
        assert target[0] in place, where
        assert place[target[0]] < place[room], f"{where}: a room listed above {room}"
        if target[0] in CORE_ROOMS:  # the agent layer's rooms may reach each other's modules
            assert len(target) == 1, f"{where}: another room's module, not its face"


def test_no_module_of_the_engine_or_the_adapters_is_over_600_lines():
    for folder in ("engine", "adapters"):
        for path in (ROOT / folder).rglob("*.py"):
            assert len(path.read_text().splitlines()) <= 600, path


def test_no_engine_module_imports_a_provider():
    """The providers and MCP live in waypoint.adapters, above the engine: only the faces that keep their public
    names (`waypoint.engine.models.OpenAIChatModel`, ...) and the old-path table name them, as strings."""
    for path in (ROOT / "engine").rglob("*.py"):
        text = path.read_text()
        assert "import waypoint.adapters" not in text and "from waypoint.adapters" not in text, path
        if path.relative_to(ROOT / "engine").as_posix() not in ("models/__init__.py", "models/offline.py", "tools/__init__.py",
                                                                 "_moved.py"):
            assert "waypoint.adapters" not in text, path


def test_old_module_paths_still_import_with_a_deprecation_warning(tmp_path):
    """A module that moved in issue 31 imports from its old path as the very same module, warning at the line that
    imports it (so Python's default filters show it in a script), for one release; the module keeps its own name
    and spec, so a reload and the relative imports inside its functions still work."""
    script = tmp_path / "user.py"
    script.write_text(
        "import importlib, warnings\n"
        "import waypoint.engine.checkpoint as old\n"  # line 2
        "import waypoint.engine.keep.checkpoint as new\n"
        "from waypoint.engine.runner import Run\n"  # line 4
        "from waypoint.engine.models.openai import OpenAIChatModel\n"  # line 5
        "from waypoint.engine.models.offline import model_from_env\n"  # line 6
        "import waypoint.engine as engine\n"
        "from waypoint.engine.run import Run as R; import waypoint.adapters.openai_chat as a, waypoint.adapters.env as env\n"
        "print(old is new, Run is R, OpenAIChatModel is a.OpenAIChatModel, model_from_env is env.model_from_env,\n"
        "      new.__spec__.name, engine.graph.Graph is engine.Graph)\n"
        "importlib.reload(new)\n"
        "print(new.__name__, new.Checkpointer.__module__)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.stdout.split() == ["True", "True", "True", "True", "waypoint.engine.keep.checkpoint", "True",
                                  "waypoint.engine.keep.checkpoint", "waypoint.engine.keep.checkpoint"], out.stderr
    for line, old, new in [(2, "waypoint.engine.checkpoint", "waypoint.engine.keep.checkpoint"),
                           (4, "waypoint.engine.runner", "waypoint.engine.run.loop"),
                           (5, "waypoint.engine.models.openai", "waypoint.adapters.openai_chat"),
                           (6, "waypoint.engine.models.offline.model_from_env", "waypoint.adapters.env")]:
        assert f"user.py:{line}: DeprecationWarning: {old} moved to {new}" in out.stderr, out.stderr
    quiet = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-W", "error::ImportWarning", "-c",
                            "from waypoint.engine.models import OpenAIChatModel, model_from_env\n"
                            "from waypoint.engine.tools import MCPServerStdio\n"
                            "from waypoint.engine.serde import Serializer, register_type\n"  # DESIGN.md's codec path
                            "from waypoint.engine import read_run, serde"],
                           capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0, quiet.stderr  # the public names and paths are not deprecated
