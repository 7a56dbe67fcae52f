"""Text a model (or a client) sends is data: against `waypoint serve` in a child process, hostile text is
stored exactly and shown safely, never breaks a list or a stream for others, and what cannot be valid is
refused at the door (422) — plus the API's own edges: run IDs, cursors, versions, the OpenAPI document,
event IDs, and reads that stay flat as a run grows."""

from __future__ import annotations

import base64
import json

import pytest

pytest.importorskip("fastapi")

from openapi_check import declared_schema, violations  # noqa: E402
from service_support import ServeProcess, events, raw_input  # noqa: E402

SURROGATE_ARGS = '{"command": "ls \\ud800"}'  # valid JSON text: a lone surrogate once decoded
BIDI_COMMAND = "echo hello \u202e\u2066; rm -rf ~/ \u2069 \u2066#\u2069\u202c"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("hostile")) as s:
        yield s


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def paused(client, cid: str, *calls: tuple[str, str]) -> dict:
    r = client.post("/runs", json={"agent": "raw", "input": raw_input(*calls), "checkpoint_id": cid, "wait": True})
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "interrupted", r.json()
    return r.json()


def first_events(client, path: str, n: int = 0, until: str = "", **kw) -> list[tuple[str | None, str, dict]]:
    """The first `n` events of a stream (or up to the first of kind `until`)."""
    out = []
    with client.stream("GET", path, **kw) as resp:
        assert resp.status_code == 200
        for item in events(resp):
            out.append(item)
            if len(out) == n or item[1] == until:
                break
    return out


def test_a_lone_surrogate_from_the_model_breaks_no_list_no_page_and_no_stream(server, client):
    other = paused(client, "waits-too", ("execute", '{"command": "uptime"}'))
    ((hub_seen, _, _),) = first_events(client, "/events", 1)
    r = client.post("/runs", json={"agent": "raw", "input": raw_input(("execute", SURROGATE_ARGS)),
                                   "checkpoint_id": "surrogate"})
    assert r.status_code == 201
    live = first_events(client, "/runs/surrogate/events", until="end",
                        headers={"Last-Event-ID": str(r.json()["last_event_id"])})
    call = next(d for _, k, d in live if k == "tool_call")
    assert call["arguments"] == {"command": "ls \ud800"}  # the run's stream carried it, escaped
    hub = first_events(client, "/events", until="interrupt", headers={"Last-Event-ID": hub_seen})
    assert hub[-1][2]["interrupts"][0]["arguments"] == {"command": "ls \ud800"}  # and the page's stream too
    run = client.get("/runs/surrogate").json()
    (pending,) = run["interrupts"]
    assert pending["arguments"] == {"command": "ls \ud800"}  # exactly what the model wrote, JSON-escaped
    assert pending["arguments_json"] == SURROGATE_ARGS
    listed = client.get("/approvals")
    assert listed.status_code == 200 and listed.json()["unreadable"] == []
    assert {"waits-too", "surrogate"} <= {a["checkpoint_id"] for a in listed.json()["approvals"]}
    assert client.get("/runs/surrogate").status_code == 200 and client.get("/runs").status_code == 200
    for _ in range(2):  # a reconnect gets its snapshot again
        ((_, kind, snap),) = first_events(client, "/runs/surrogate/events", 1)
        assert kind == "snapshot" and snap["interrupts"][0]["arguments"] == {"command": "ls \ud800"}
        assert first_events(client, "/events", 1)[0][1] == "snapshot"
    answer = {"action": "approve", "interrupt_id": pending["id"], "digest": pending["digest"]}
    r = client.post("/runs/surrogate/resume", json={"answers": [answer], "wait": True})
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    assert r.json()["messages"][-1]["content"] == "The tool said: ran ls \ud800"
    assert server.ran()[-1] == "ls \\ud800"  # the tool ran once, with the stored arguments
    assert other["interrupts"][0]["id"] in {a["id"] for a in client.get("/approvals").json()["approvals"]}


@pytest.mark.parametrize("body, loc", [
    (b'{"agent": "ops", "input": "x\\ud800", "checkpoint_id": "sur-1"}', ["body", "input"]),
    (b'{"agent": "ops", "input": "x", "checkpoint_id": "sur-\\udc00"}', ["body", "checkpoint_id"]),
    (b'{"agent": "ops", "input": [{"role": "user", "content": "\\ud83d"}], "checkpoint_id": "sur-2"}',
     ["body", "input", 0, "content"]),
    (b'{"agent": "steps", "input": {"n\\ud800": 1}, "checkpoint_id": "sur-3"}', ["body", "input", "n\\ud800"]),
])
def test_lone_surrogates_in_a_request_body_are_422_and_nothing_is_stored(client, body, loc):
    r = client.post("/runs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc
    assert all(not row["checkpoint_id"].startswith("sur-") for row in client.get("/runs").json()["runs"])
    r = client.post("/runs", content=b'{"agent": "ops", "input": "\\ud83d\\ude00 is fine", "checkpoint_id": "pair"}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 201  # a surrogate *pair* is one character: valid


def test_lone_surrogates_in_an_answer_or_a_login_are_422(server, client):
    run = paused(client, "answer-sur", ("execute", '{"command": "date"}'))
    iid = run["interrupts"][0]["id"]
    body = ('{"answers": [{"action": "respond", "interrupt_id": "%s", "output": "up \\udfff"}]}' % iid).encode()
    r = client.post("/runs/answer-sur/resume", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "answers", 0, "output"]
    assert client.get("/runs/answer-sur").json()["version"] == run["version"]  # nothing was written
    with server.client(token=None) as anonymous:
        r = anonymous.post("/ui/login", content=b'{"token": "abc\\ud800"}',
                           headers={"Content-Type": "application/json", "X-Requested-With": "waypoint"})
        assert r.status_code == 422 and "abc" not in r.text
        r = anonymous.post("/ui/login", content=b'{"token": "\xed\xa0\x80 not utf-8"}',
                           headers={"Content-Type": "application/json", "X-Requested-With": "waypoint"})
        assert r.status_code == 422 and "not UTF-8" in r.text


DEEP = 3000  # past pydantic's 200 levels; 100,000 is past Python's own parser (RecursionError)


@pytest.mark.parametrize("path, body", [
    ("/runs/deep/resume", b"[" * 200_000 + b"]" * 200_000),
    ("/runs/deep/resume", b'{"answers": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("/runs/deep/resume", b'{"answers": [], "note": "\\ud800", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("/runs/deep/resume", b'{"answers": [{"action": "respond", "interrupt_id": "i", "output": '
                          + b"[" * DEEP + b"]" * DEEP + b"}]}"),
    ("/runs/deep/resume", b'{"answers": [], "expected_version": ' + b"9" * 5000 + b"}"),
    ("/runs", b'{"agent": "steps", "input": {"n": ' + b"1" * 5000 + b"}}"),
    ("/ui/login", b'{"token": ' + b"[" * DEEP + b"]" * DEEP + b"}"),  # within the login's 8 KiB
])
def test_json_the_parser_cannot_read_is_422_never_a_500(server, client, path, body):
    if client.get("/runs/deep").status_code == 404:
        paused(client, "deep", ("execute", '{"command": "pwd"}'))
    before = len(server.output)
    r = client.post(path, content=body, headers={"Content-Type": "application/json", "X-Requested-With": "waypoint"})
    assert r.status_code == 422, (r.status_code, r.text[:300])
    assert r.json()["detail"][0]["loc"] == ["body"] and len(r.text) < 500  # what was sent is never echoed
    assert "Traceback" not in "".join(server.output[before:])
    assert client.get("/runs/deep").json()["status"] == "interrupted"


def test_a_body_nested_up_to_the_limit_is_accepted(client):
    deep = json.loads("[" * 98 + "]" * 98)  # 100 levels with the body and the input around it
    r = client.post("/runs", json={"agent": "steps", "input": {"n": 1, "deep": deep}, "checkpoint_id": "nested",
                                   "wait": True})
    assert r.status_code == 201 and r.json()["status"] == "completed", r.text[:300]
    r = client.post("/runs", json={"agent": "steps", "input": {"n": 1, "deep": [deep]}, "checkpoint_id": "nested2"})
    assert r.status_code == 422 and "more than 100 levels" in r.json()["detail"][0]["msg"]


def test_bidi_and_zero_width_text_is_stored_and_answered_exactly(client):
    args = json.dumps({"command": BIDI_COMMAND}, ensure_ascii=False)
    run = paused(client, "bidi \u202eevil", ("exe\u200bcute", args))
    (pending,) = run["interrupts"]
    assert (pending["tool"], pending["arguments"]["command"]) == ("exe\u200bcute", BIDI_COMMAND)
    assert run["checkpoint_id"] == "bidi \u202eevil"


@pytest.mark.parametrize("cid", [".", "..", "a\nb", "a\x00b", "tab\there", "del\x7f", "a/b"])
def test_run_ids_a_url_cannot_address_are_422(client, cid):
    r = client.post("/runs", json={"agent": "ops", "input": "x", "checkpoint_id": cid})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "checkpoint_id"], (cid, r.text)


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize("raw", ["[" + "9" * 400 + ', "a"]', "[1e400, \"a\"]", "[NaN, \"a\"]", "[-Infinity, \"a\"]",
                                 '[1, "\\ud800"]', "[true, \"a\"]", "[-5, \"a\"]", '[1, ""]'])
def test_forged_list_cursors_are_422(client, raw):
    r = client.get("/runs", params={"before": _cursor(raw)})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "before"], (raw, r.text)


def test_versions_past_what_json_holds_are_422(client):
    paused(client, "versions", ("execute", '{"command": "w"}'))
    for params in ({"version": 2**63}, {"version": 2**53 + 1}, {"version": "1e3"}):
        r = client.get("/runs/versions", params=params)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "version"], (params, r.text)
    assert client.get("/runs/versions/history", params={"before": 2**63}).status_code == 422
    r = client.post("/runs/versions/resume", json={"expected_version": 2**63})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "expected_version"]


def test_after_and_last_event_id_mean_the_same(client):
    client.post("/runs", json={"agent": "steps", "input": {"n": 2}, "checkpoint_id": "ev", "wait": True})
    for how in ({"params": {"after": "abc"}}, {"headers": {"Last-Event-ID": "abc"}},
                {"params": {"after": "-1"}}, {"headers": {"Last-Event-ID": "12abc"}}):
        ((_, kind, data),) = first_events(client, "/runs/ev/events", 1, **how)
        assert kind == "snapshot" and data["status"] == "completed", how


def test_a_deleted_runs_events_never_reach_a_new_run_on_its_id(client):
    r = client.post("/runs", json={"agent": "raw", "input": raw_input(("execute", '{"command": "cat /secret"}')),
                                   "checkpoint_id": "reuse"})
    start = r.json()["last_event_id"]
    old = first_events(client, "/runs/reuse/events", until="end", headers={"Last-Event-ID": str(start)})
    assert any("cat /secret" in json.dumps(d) for _, _, d in old)
    assert client.delete("/runs/reuse").status_code == 204
    paused(client, "reuse", ("execute", '{"command": "ls"}'))
    for seen, _, _ in old:
        got = first_events(client, "/runs/reuse/events", 1, params={"after": seen})
        assert got[0][1] == "snapshot" and "cat /secret" not in json.dumps(got), got


def test_a_read_stays_flat_as_the_history_grows(client):
    r = client.post("/runs", json={"agent": "steps", "input": {"n": 45}, "checkpoint_id": "long", "wait": True})
    assert r.status_code == 201 and r.json()["status"] == "completed"
    newest = r.json()["newest_version"]
    assert newest > 45
    run = client.get("/runs/long").json()
    assert [h["version"] for h in run["history"]] == list(range(newest, newest - 20, -1))
    assert run["history_next"] == newest - 19
    seen, before = [h["version"] for h in run["history"]], run["history_next"]
    while before is not None:
        page = client.get("/runs/long/history", params={"before": before, "limit": 7}).json()
        seen += [h["version"] for h in page["history"]]
        before = page["next"]
    assert seen == list(range(newest, 0, -1))  # every version once, newest first
    assert len(client.get("/runs/long", params={"history_limit": 3}).json()["history"]) == 3
    assert client.get("/runs/nope/history").status_code == 404


def test_the_openapi_document_declares_what_the_service_answers(client):
    doc = client.get("/openapi.json").json()
    run = paused(client, "doc", ("execute", '{"command": "df"}'))
    pending = run["interrupts"][0]
    checks = [
        ("/runs", "post", 201, run),
        ("/runs", "post", 201, client.post("/runs", json={"agent": "steps", "input": {"n": 1}}).json()),
        ("/runs/{checkpoint_id}", "get", 200, client.get("/runs/doc").json()),
        ("/runs/{checkpoint_id}", "get", 200, client.get("/runs/ev").json()),
        ("/runs/{checkpoint_id}/history", "get", 200, client.get("/runs/doc/history").json()),
        ("/approvals", "get", 200, client.get("/approvals").json()),
        ("/runs", "get", 200, client.get("/runs").json()),
        ("/runs/{checkpoint_id}", "get", 404, client.get("/runs/none").json()),
        ("/runs/{checkpoint_id}/resume", "post", 409, client.post("/runs/doc/resume", json={
            "answers": [{"action": "approve", "interrupt_id": "gone", "digest": "x"}]}).json()),
        ("/runs/{checkpoint_id}/resume", "post", 200, client.post("/runs/doc/resume", json={
            "answers": [{"action": "approve", "interrupt_id": pending["id"], "digest": pending["digest"]}],
            "wait": True}).json()),
    ]
    for path, method, status, answer in checks:
        problems = violations(doc, declared_schema(doc, path, method, status), answer)
        assert not problems, (path, method, status, problems)
    for path in ("/events", "/runs/{checkpoint_id}/events"):
        responses = doc["paths"][path]["get"]["responses"]
        assert set(responses["200"]["content"]) == {"text/event-stream"}, path
        assert set(responses["401"]["content"]) == {"application/json"}, path
    for path, method in (("/runs", "post"), ("/runs/{checkpoint_id}/resume", "post")):
        assert {"500", "503", "413", "429"} <= set(doc["paths"][path][method]["responses"])
