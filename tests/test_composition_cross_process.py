"""Agents made of agents, across real processes on a real SQLite file: a pause anywhere inside a composition is
answered by another process and resumes exactly there, with nothing that finished running again; a SIGKILL
inside an agent used as a tool is taken over where it was.

Each step is one process of tests/procs/composition_proc.py; the journal counts every model call per agent and
every real tool execution (with its idempotency key and rerun flag).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

PROC = Path(__file__).parent / "procs" / "composition_proc.py"


def start(db, cid, scenario, action, value=None, *, journal, **options):
    flags = []
    for name, option in options.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if option is True else [] if option is False else [flag, str(option)]
    cmd = [sys.executable, str(PROC), str(db), cid, scenario, action, *([value] if value is not None else []),
           "--journal", str(journal), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(db, cid, scenario, action, value=None, **kw) -> tuple[int, list[dict], str]:
    proc = start(db, cid, scenario, action, value, **kw)
    out, err = proc.communicate(timeout=90)
    return proc.returncode, [json.loads(line) for line in out.splitlines() if line.strip()], err


def pauses(lines) -> list[list]:
    return next(line["interrupt"] for line in reversed(lines) if "interrupt" in line)


def outputs(lines) -> list[list]:
    return [line["output"] for line in lines if "output" in line]


def journal_of(journal: Path) -> list[list[str]]:
    return [line.split(" ") for line in journal.read_text().splitlines()] if journal.exists() else []


def models(journal: Path) -> Counter:
    return Counter(row[1] for row in journal_of(journal) if row[0] == "model")


def executed(journal: Path) -> list[list[str]]:
    """[tool, arguments, pid, key, rerun] per real execution."""
    rows = []
    for line in journal.read_text().splitlines() if journal.exists() else []:
        if line.startswith("tool "):
            name, rest = line[5:].split(" ", 1)
            text, pid, key, rerun = rest.rsplit(" ", 3)
            rows.append([name, json.loads(text), pid, key, rerun])
    return rows


# --- three levels: supervisor → AgentTool(researcher) → a tool under approval --------------------------------

def test_an_approval_inside_an_agent_tool_is_answered_by_another_process(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "s", "three", "run", "when do backups run?", journal=journal)
    assert code == 2, err
    ((iid, kind, tool, arguments, address),) = pauses(out)
    assert (kind, tool, json.loads(arguments)) == ("approval", "search", {"query": "backups"})  # classified
    assert address.startswith("runnable:supervisor;node:tools;tool:researcher:") and ";runnable:researcher;" in address
    assert [r[0] for r in executed(journal)] == ["lookup"] and models(journal) == {"supervisor": 1, "researcher": 2}
    assert out[-1] == {"runs": ["s"]}  # the researcher's run is part of the supervisor's: one run in the store

    code, out, err = run(db, "s", "three", "answer", json.dumps({iid: "approve"}), journal=journal)
    assert code == 0, err
    said = outputs(out)
    assert [["supervisor", "researcher"], "tool", "found backups"] in said  # the tool ran, in the researcher
    assert said[-2][:2] == [["supervisor"], "tool"] and said[-2][2].startswith("researcher: ")  # it answered
    assert said[-1][:2] == [["supervisor"], "assistant"] and "found backups" in said[-1][2]  # then the supervisor
    assert [r[0] for r in executed(journal)] == ["lookup", "search"]  # each ran once
    assert models(journal) == {"supervisor": 2, "researcher": 3}  # nothing that finished was asked again
    assert len({r[2] for r in executed(journal)}) == 2  # lookup in the first process, search in the second
    assert out[-2] == {"decisions": [["search", "approved", ["researcher"]]]}  # the researcher's, in the outer run
    assert out[-1] == {"runs": ["s"]}

    code, _, err = run(db, "s", "three", "answer", json.dumps({iid: "approve"}), journal=journal)
    assert code == 3 and "has completed" in err, err  # the answer was consumed: sent again, it runs nothing
    assert [r[0] for r in executed(journal)] == ["lookup", "search"]


def test_a_sigkill_inside_the_agent_tools_approved_call_is_taken_over_there(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "k", "three", "run", "go", journal=journal, tool="slow")
    assert code == 2, err
    ((iid, *_),) = pauses(out)
    victim = start(db, "k", "three", "answer", json.dumps({iid: "approve"}), journal=journal, tool="slow", sleep=60)
    deadline = time.monotonic() + 30
    while [r[0] for r in executed(journal)] != ["lookup", "slow"]:  # approved; inside its side effect, asleep
        assert time.monotonic() < deadline and victim.poll() is None, victim.communicate()
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    before = models(journal)

    code, out, err = run(db, "k", "three", "continue", journal=journal, tool="slow", takeover=True)
    assert code == 0, err
    assert not any("interrupt" in line for line in out)  # the stored approval stands: nobody was asked again
    (lookup, first, again) = executed(journal)
    assert again[0] == "slow" and again[4] == "True" and first[4] == "False" and again[3] == first[3]  # flagged, same key
    assert {"rerun": [["supervisor", "researcher"], "call_1", first[3]]} in out
    # nothing else ran again: not the lookup, not either agent's earlier model calls — only the ones after the tool
    assert lookup[0] == "lookup" and models(journal) - before == {"researcher": 1, "supervisor": 1}
    assert outputs(out)[-1][:2] == [["supervisor"], "assistant"] and "slowly found backups" in outputs(out)[-1][2]
    assert out[-2] == {"decisions": [["slow", "approved", ["researcher"]]]}  # kept across the SIGKILL
    assert out[-1] == {"runs": ["k"]}


def test_a_crash_inside_an_agent_tool_continues_it_from_its_last_finished_step(tmp_path):
    """No pause before the crash: the researcher's finished steps (a model call, a tool, a model call) are in the
    supervisor's checkpoint, so the takeover runs only the step that was cut off."""
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    victim = start(db, "c", "three", "run", "go", journal=journal, tool="slow", sleep=60, unguarded=True)
    deadline = time.monotonic() + 30
    while [r[0] for r in executed(journal)] != ["lookup", "slow"]:
        assert time.monotonic() < deadline and victim.poll() is None, victim.communicate()
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert models(journal) == {"supervisor": 1, "researcher": 2}

    code, out, err = run(db, "c", "three", "continue", journal=journal, tool="slow", unguarded=True, takeover=True)
    assert code == 0, err
    assert [r[0] for r in executed(journal)] == ["lookup", "slow", "slow"]  # lookup is not run again
    assert executed(journal)[2][4] == "True" and executed(journal)[2][3] == executed(journal)[1][3]
    assert models(journal) == {"supervisor": 2, "researcher": 3}  # one model call each after the tool, no more


def test_two_calls_of_one_agent_tool_in_a_batch_are_two_pauses_with_keys_of_their_own(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "two", "three", "run", "go", journal=journal, calls=2)
    assert code == 2, err
    (first, second) = pauses(out)
    assert first[0] != second[0] and first[4] != second[4]  # two pauses, two addresses
    code, out, err = run(db, "two", "three", "answer", json.dumps({first[0]: "approve"}), journal=journal, calls=2)
    assert code == 2, err
    assert [p[0] for p in pauses(out)] == [second[0]]  # the other one still waits, under its own ID
    code, out, err = run(db, "two", "three", "answer", json.dumps({second[0]: "approve"}), journal=journal, calls=2)
    assert code == 0, err
    searched = [r for r in executed(journal) if r[0] == "search"]
    looked = [r for r in executed(journal) if r[0] == "lookup"]
    assert len(searched) == 2 and len({r[3] for r in searched}) == 2  # two executions, two idempotency keys
    assert len(looked) == 2 and len({r[3] for r in looked}) == 2  # never one ledger entry for both calls


# --- workflow agents ---------------------------------------------------------------------------------------------

def test_a_pause_in_the_second_of_three_sequential_agents_resumes_at_the_second(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "seq", "sequential", "run", "write about backups", journal=journal)
    assert code == 2, err
    ((iid, kind, tool, _, address),) = pauses(out)
    assert (kind, tool) == ("approval", "publish") and address.startswith("runnable:pipeline;node:b;")
    assert models(journal) == {"a": 1, "b": 1}
    code, out, err = run(db, "seq", "sequential", "answer", json.dumps({iid: "approve"}), journal=journal)
    assert code == 0, err
    assert models(journal) == {"a": 1, "b": 2, "c": 1}  # a did not run again; c ran after b
    assert [r[0] for r in executed(journal)] == ["publish"]
    said = outputs(out)
    assert [p for p, *_ in said] == [["pipeline", "b"]] * 2 + [["pipeline", "c"]]
    # session values flowed: b's instruction read a's answer, c's read b's
    assert said[-1][2].startswith("c: You review b: You draft from a: You outline. | . | published the draft.")


def test_a_parallel_branch_that_paused_resumes_alone(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "par", "parallel", "run", "go", journal=journal)
    assert code == 2, err
    ((iid, kind, tool, _, address),) = pauses(out)
    assert (kind, tool) == ("approval", "publish") and address.startswith("runnable:fanout;node:b;")
    assert models(journal) == {"a": 1, "b": 1, "c": 1}  # a and c finished while b waited
    code, out, err = run(db, "par", "parallel", "answer", json.dumps({iid: "approve"}), journal=journal)
    assert code == 0, err
    assert models(journal) == {"a": 1, "b": 2, "c": 1}  # the finished branches kept their answers
    assert [r[0] for r in executed(journal)] == ["publish"]


def test_a_crash_with_two_agent_tool_calls_in_flight_reruns_both_with_their_keys(tmp_path):
    """Two researcher runs record their steps while both are in flight: the ledger page they share must not move,
    or the takeover would lose what one of them started (and give its call a new key)."""
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    victim = start(db, "two", "three", "run", "go", journal=journal, tool="slow", sleep=60, unguarded=True, calls=2)
    deadline = time.monotonic() + 30
    while sorted(r[0] for r in executed(journal)) != ["lookup", "lookup", "slow", "slow"]:
        assert time.monotonic() < deadline and victim.poll() is None, victim.communicate()
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    code, out, err = run(db, "two", "three", "continue", journal=journal, tool="slow", unguarded=True, takeover=True,
                         calls=2)
    assert code == 0, err
    rows = executed(journal)
    assert [r[0] for r in rows].count("lookup") == 2  # neither lookup ran again
    first, again = [r for r in rows[:4] if r[0] == "slow"], [r for r in rows[4:]]
    assert sorted(r[0] for r in again) == ["slow", "slow"] and all(r[4] == "True" for r in again)
    assert sorted(r[3] for r in again) == sorted(r[3] for r in first)  # each with its own key, as before
    assert len({r[3] for r in first}) == 2


def test_a_crash_late_in_a_long_agent_tool_run_continues_it_with_its_whole_conversation(tmp_path):
    """40 rounds of the researcher's lookups, each recorded as a segment of its conversation's chain in the
    supervisor's versions (issue 34 §1): after a SIGKILL in the 41st tool call, the takeover reads the chain back
    whole — the researcher counts its rounds from its conversation, so a lost message would run a lookup again."""
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    victim = start(db, "long", "three", "run", "go", journal=journal, tool="slow", sleep=60, unguarded=True, rounds=40)
    deadline = time.monotonic() + 60
    while [r[0] for r in executed(journal)][-1:] != ["slow"]:
        assert time.monotonic() < deadline and victim.poll() is None, victim.communicate()
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert models(journal) == {"supervisor": 1, "researcher": 41}

    code, out, err = run(db, "long", "three", "continue", journal=journal, tool="slow", unguarded=True, takeover=True,
                         rounds=40)
    assert code == 0, err
    rows = executed(journal)
    assert [r[0] for r in rows] == ["lookup"] * 40 + ["slow", "slow"]
    assert [r[1] for r in rows[:40]] == ["backups"] + [f"backups {i}" for i in range(1, 40)]
    assert rows[-1][4] == "True" and rows[-1][3] == rows[-2][3]
    assert models(journal) == {"supervisor": 2, "researcher": 42}
