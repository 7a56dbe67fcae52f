"""New input while a chat's turn executes, over HTTP (`POST /runs` with `on_busy`): two `waypoint serve` processes on
one SQLite file, the turn executing in one of them — or, with `--queue`, in a `waypoint worker` — and clients sending
to both at once (docs/service.md, "New input while a run is active")."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from service_support import ServeProcess, wait_until  # noqa: E402
from test_service_workers import Stream, spawn_worker  # noqa: E402

TIMEOUT = 60.0


def lines(chat: Path) -> list[list[str]]:
    path = chat / "journal"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def conversation(c, cid: str) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in c.get(f"/runs/{cid}").json()["messages"]]


def settled(c, cid: str, last: str) -> list[tuple[str, str]]:
    """The conversation once the chat's newest turn completed with the answer `last`."""
    def done():
        view = c.get(f"/runs/{cid}").json()
        said = [(m["role"], m["content"]) for m in view.get("messages", [])]
        return view["status"] == "completed" and said and said[-1] == ("assistant", last) and said
    return wait_until(done, TIMEOUT, f"{cid} answered {last!r}")


def held(chat: Path, key: str) -> None:
    wait_until(lambda: ["note", key, "start"] in [w[:3] for w in lines(chat)], TIMEOUT, f"note {key} held")


def race(ca, cb, sends: list[tuple[str, dict]]) -> list[str]:
    """Send two inputs at once, the first through A and the second through B; each is queued (202). Their texts in
    the order the store numbered them."""
    answers: dict[str, object] = {}
    go = threading.Barrier(2)

    def send(client, text, body):
        go.wait()
        answers[text] = client.post("/runs", json={"input": text, "checkpoint_id": "chat", **body})

    threads = [threading.Thread(target=send, args=(client, text, body)) for client, (text, body) in zip((ca, cb), sends)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    for text, body in sends:
        got = answers[text]
        assert got.status_code == 202 and got.json()["status"] == "queued", got.text
        assert got.json()["queued"]["policy"] == body.get("on_busy", "enqueue")
        assert got.json()["queued"]["by"] == body.get("by", "the service's API")
    order = sorted(answers, key=lambda text: answers[text].json()["queued"]["n"])
    first = answers[order[0]].json()["queued"]["n"]
    assert [answers[text].json()["queued"]["n"] for text in order] == [first, first + 1]
    return order


def asked(chat: Path, count: int) -> None:
    """Wait until the process executing the chat read `count` cancel requests in all."""
    wait_until(lambda: sum(w[0] == "asked" for w in lines(chat)) >= count, TIMEOUT, f"{count} cancel request(s) read")


@pytest.mark.parametrize("where", ["service", "worker"])
def test_inputs_sent_to_two_services_at_once_run_after_the_turn_in_one_order_by_each_policy(tmp_path, procs, where):
    chat = tmp_path / "chat"
    chat.mkdir()
    env = {"CHAT_DIR": str(chat)}
    db = str(tmp_path / "runs.db")
    queue = ("--queue",) if where == "worker" else ()
    if where == "worker":
        procs.append(spawn_worker(db, chat, tmp_path, graphs="chat_turns:build", env=env))
    with ServeProcess(tmp_path, agents="chat_turns:build", db=db, env=env, args=queue) as a, \
            ServeProcess(tmp_path, agents="chat_turns:build", db=db, env=env, args=(*queue, "--on-busy", "enqueue")) as b, \
            a.client() as ca, b.client() as cb:
        executor = str(procs[0].pid if where == "worker" else a.proc.pid)
        hub = Stream(a, "/events")  # the service's own events: each queued input's turn is announced as it starts
        assert ca.post("/runs", json={"input": "hold 1", "checkpoint_id": "chat"}).status_code in (201, 202)
        held(chat, "1")

        # A's default is reject: 409, and nothing is queued
        refused = ca.post("/runs", json={"input": "refused", "checkpoint_id": "chat"})
        assert refused.status_code == 409, refused.text

        # two clients at once, one on each service: both queued, numbered in one order
        order = race(ca, cb, [("from alice", {"on_busy": "enqueue", "by": "alice"}),
                              ("from bob", {"by": "bob"})])  # B's default: enqueue
        by = {"from alice": "alice", "from bob": "bob"}

        (chat / "gate-1").touch()  # the turn in flight finishes; then each input runs as a turn, in their order
        said = settled(ca, "chat", f"answered {order[1]}")
        assert said == [("user", "hold 1"), ("assistant", ""), ("tool", "noted 1"), ("assistant", "answered 1"),
                        ("user", order[0]), ("assistant", f"answered {order[0]}"),
                        ("user", order[1]), ("assistant", f"answered {order[1]}")]
        assert "refused" not in str(said)
        assert settled(cb, "chat", f"answered {order[1]}") == said  # the other service reads the same chat
        assert ca.get("/runs/chat").json()["input_taken"] == 2
        if where == "service":  # the service executing the turns announces each queued input's
            for n, text in enumerate(order, 1):
                taken = hub.wait_for("input", lambda d, n=n: d["n"] == n, TIMEOUT)
                assert (taken["checkpoint_id"], taken["by"]) == ("chat", by[text])
            assert [d["n"] for _, k, d in hub.events if k == "input"] == [1, 2]
        hub.close()

        # interrupt, two at once: the turn stops at its next step (its tool's result kept, no answer to it), then
        # both inputs run in their order
        assert ca.post("/runs", json={"input": "hold 2", "checkpoint_id": "chat"}).status_code in (201, 202)
        held(chat, "2")
        stops = race(ca, cb, [("stop one", {"on_busy": "interrupt"}), ("stop two", {"on_busy": "interrupt"})])
        asked(chat, 1)  # the executing process read a request: the step in flight is its last
        (chat / "gate-2").touch()
        said = settled(ca, "chat", f"answered {stops[1]}")
        assert said[8:] == [("user", "hold 2"), ("assistant", ""), ("tool", "noted 2"),
                            ("user", stops[0]), ("assistant", f"answered {stops[0]}"),
                            ("user", stops[1]), ("assistant", f"answered {stops[1]}")]
        assert ["model", '"noted', "2\""] not in [w[:3] for w in lines(chat)]  # no model call after the tool step

        # rollback, two at once: the turn is stopped now and dropped (its input too; its tool never finishes), then
        # both inputs run in their order
        assert ca.post("/runs", json={"input": "hold 3", "checkpoint_id": "chat"}).status_code in (201, 202)
        held(chat, "3")
        drops = race(ca, cb, [("instead", {"on_busy": "rollback", "by": "carol"}),
                              ("instead too", {"on_busy": "rollback", "by": "dave"})])
        said = settled(ca, "chat", f"answered {drops[1]}")
        both = [("user", drops[0]), ("assistant", f"answered {drops[0]}"), ("user", drops[1]),
                ("assistant", f"answered {drops[1]}")]
        # (on a loaded machine the second can reach the chat only once the first's turn runs: then it drops that one)
        assert said[15:] in (both, both[2:]), said[15:]
        assert "hold 3" not in str(said)
        assert ["note", "3", "done"] not in [w[:3] for w in lines(chat)]
        # each queued input ran once, in the process that executed the chat (A)
        models = [w for w in lines(chat) if w[0] == "model" and w[1].startswith('"') and "answered" not in w[1]]
        texts = [" ".join(w[1:-1]) for w in models]
        for text in ("from alice", "from bob", "stop one", "stop two", "instead", "instead too"):
            assert texts.count(f'"{text}"') == 1, texts
        pids = {w[-1] for w in models}
        assert pids == {executor}, (pids, executor)


def test_on_busy_is_refused_where_it_means_nothing(tmp_path):
    from fastapi.testclient import TestClient
    from service_support import TOKEN, approval_agent

    from waypoint.engine import END, START, Graph
    from waypoint.service import ServiceError, create_app
    from waypoint.stores import SQLiteStore

    graph = Graph(name="plain")
    graph.add_node("echo", lambda x: x)
    graph.add_edge(START, "echo")
    graph.add_edge("echo", END)
    store = SQLiteStore(tmp_path / "runs.db")
    with pytest.raises(ServiceError, match="must be one of reject, enqueue, interrupt, rollback"):
        create_app(approval_agent([]), store, auth=TOKEN, on_busy="later")

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app({"ops": approval_agent([]), "plain": graph}, store, auth=TOKEN)) as c:
        on_graph = c.post("/runs", json={"agent": "plain", "input": 1, "on_busy": "enqueue"}, headers=headers)
        assert on_graph.status_code == 422 and "is a graph" in on_graph.text, on_graph.text
        bogus = c.post("/runs", json={"agent": "ops", "input": "hi", "on_busy": "later"}, headers=headers)
        assert bogus.status_code == 422 and "on_busy" in bogus.text
        for who in ("a\x00b", "line\nbreak"):  # never a 500, never stored
            hostile = c.post("/runs", json={"agent": "ops", "input": "hi", "checkpoint_id": "h", "on_busy": "enqueue",
                                            "by": who}, headers=headers)
            assert hostile.status_code == 422 and hostile.json()["detail"][0]["loc"] == ["body", "by"], hostile.text
        empty = c.post("/runs", json={"agent": "ops", "input": [], "checkpoint_id": "h"}, headers=headers)
        assert empty.status_code == 422 and "at least one message" in empty.text, empty.text
        assert c.get("/runs/h", headers=headers).status_code == 404


def test_inputs_left_when_a_queued_turn_completes_in_a_shutdowns_drain_run_on_the_next_service(tmp_path):
    """A stops before it can take the inputs after the turn it finished while draining — a queued input's turn, so
    the input left is older than the run that stopped: another service finds it and takes it."""
    chat = tmp_path / "chat"
    chat.mkdir()
    env = {"CHAT_DIR": str(chat)}
    db = str(tmp_path / "runs.db")
    with ServeProcess(tmp_path, agents="chat_turns:build", db=db, env=env) as a, \
            ServeProcess(tmp_path, agents="chat_turns:build", db=db, env=env) as b, a.client() as ca, b.client() as cb:
        (chat / "hold-answer-8").touch()
        (chat / "gate-8").touch()
        assert ca.post("/runs", json={"input": "hold 7", "checkpoint_id": "chat"}).status_code == 201
        held(chat, "7")
        for text in ("hold 8", "after the drain"):
            got = cb.post("/runs", json={"input": text, "checkpoint_id": "chat", "on_busy": "enqueue"})
            assert got.status_code == 202, got.text
        (chat / "gate-7").touch()  # turn 7 ends; A runs input 1 ("hold 8"), whose last step holds
        wait_until(lambda: ["answering", "8"] in [w[:2] for w in lines(chat)], TIMEOUT, "input 1's last step held")
        a.proc.terminate()  # SIGTERM: A drains the step in flight, then stops
        wait_until(lambda: ["stopping"] in [w[:1] for w in lines(chat)], TIMEOUT, "A's drain began")
        (chat / "gate-answer-8").touch()  # input 1's turn completes inside the drain; input 2 is left
        a.proc.wait(TIMEOUT)
        said = settled(cb, "chat", "answered after the drain")
        assert said == [("user", "hold 7"), ("assistant", ""), ("tool", "noted 7"), ("assistant", "answered 7"),
                        ("user", "hold 8"), ("assistant", ""), ("tool", "noted 8"), ("assistant", "answered 8"),
                        ("user", "after the drain"), ("assistant", "answered after the drain")]
        models = [w for w in lines(chat) if w[:2] == ["model", '"after']]
        assert [w[-1] for w in models] == [str(b.proc.pid)]  # once, on the service that was left
