"""The approval page in a real headless Chromium (Debian's package, driven by Playwright) against
`waypoint serve` in a child process: a real click approves a real paused run and the tool runs once; a
rejection carries its reason to the model; the list updates live; a run's page shows its history.

The test is skipped only when Chromium or Playwright cannot be had; with WAYPOINT_REQUIRE_BROWSER=1 (set
by .ci/run) that is a failure instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

pytest.importorskip("fastapi")

from service_support import PROCS, ServeProcess  # noqa: E402

TOKEN = "browser-token-3c4d5e6f"
CHROMIUM_FLAGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    """The Chromium executable, or skip (fail when WAYPOINT_REQUIRE_BROWSER=1)."""
    required = os.environ.get("WAYPOINT_REQUIRE_BROWSER") == "1"
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as err:
        path, why = None, f"playwright is not installed ({err})"
    else:
        why = "no chromium executable (apt-get install -y chromium)"
    if path is None:
        if required:
            pytest.fail(f"WAYPOINT_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    return path


def _paused(api: httpx.Client, cid: str, command: str) -> dict:
    r = api.post("/runs", json={"agent": "ops", "input": f"please run the command {command}", "checkpoint_id": cid,
                                "wait": True})
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "interrupted", r.json()
    return r.json()


def _until(api: httpx.Client, cid: str, status: str) -> dict:
    deadline = time.monotonic() + 20
    while True:
        run = api.get(f"/runs/{cid}").json()
        if run["status"] == status and not run["active"]:
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.05)


def _until_true(page, condition, timeout: float = 15.0) -> None:
    """Let the page's events run until `condition()` holds (a route handler has been called, say)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        page.wait_for_timeout(10)


def _page(pw, chromium: str, tmp_path: Path, url: str, token: str):
    context = pw.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{url}/ui")
    page.fill("#token", token)  # the login form; the session cookie it sets is HttpOnly
    page.click("#login-form button[type=submit]")
    return context, page


def test_the_page_approves_and_rejects_paused_runs_live(tmp_path):
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    server = ServeProcess(tmp_path, agents="service_agent:build", token=TOKEN)
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api, \
                sync_playwright() as pw:
            first = _paused(api, "deploy-1", "echo deployed")
            context, page = _page(pw, chromium, tmp_path, server.url, TOKEN)
            iid = first["interrupts"][0]["id"]
            card = page.locator(f"#approvals li.card[data-run='deploy-1'][data-interrupt='{iid}']")
            expect(card.locator(".tool")).to_have_text("execute")
            expect(card.locator("pre.arguments")).to_have_text('{\n  "command": "echo deployed"\n}')
            expect(page.locator("#live")).to_have_text("live")
            assert TOKEN not in str(context.cookies())  # the page's cookie is a session, never the token
            assert server.ran() == []

            # The answer to the click is held back until the live refresh has removed the card (the run
            # moved on): the person who clicked must still see what became of their answer.
            held = []
            page.route("**/runs/*/resume", lambda route: held.append((route, route.fetch())))
            card.locator("button.approve").click()  # the real click
            done = _until(api, "deploy-1", "completed")
            expect(card).to_have_count(0)  # gone from the list once the run moved on (live, no reload)
            _until_true(page, lambda: held)
            route, response = held.pop()
            route.fulfill(response=response)
            page.unroute("**/runs/*/resume")
            expect(page.locator(f"#answered li[data-run='deploy-1'][data-interrupt='{iid}'] .outcome")
                   ).to_contain_text("approved")
            assert server.ran() == ["echo deployed"]
            assert done["decisions"][0]["verb"] == "approved"

            second = _paused(api, "deploy-2", "rm -rf /srv")  # appears without a reload: the page follows /events
            iid = second["interrupts"][0]["id"]
            card = page.locator(f"#approvals li.card[data-run='deploy-2'][data-interrupt='{iid}']")
            expect(card.locator("pre.arguments")).to_contain_text("rm -rf /srv")
            card.locator("input.reason").fill("not on a Friday")
            waiting = []
            page.route("**/runs/*/resume", lambda route: waiting.append(route))  # held before the server sees it
            card.locator("button.reject").click()
            _paused(api, "deploy-3", "ls")  # the list refreshes (live) while the answer is on its way...
            expect(page.locator("#approvals li.card[data-run='deploy-3']")).to_have_count(1)
            expect(card.locator("button.approve")).to_be_disabled()  # ...and the card stays disabled: no 2nd click
            expect(card.locator(".outcome")).to_have_text("sending…")
            _until_true(page, lambda: waiting)
            waiting.pop().continue_()
            page.unroute("**/runs/*/resume")
            answered = page.locator(f"#answered li[data-run='deploy-2'][data-interrupt='{iid}']")
            expect(answered.locator(".outcome")).to_contain_text("rejected")
            rejected = _until(api, "deploy-2", "completed")
            assert server.ran() == ["echo deployed"]  # the rejected call never ran
            tool_message = next(m for m in rejected["messages"] if m["role"] == "tool")
            assert tool_message["content"] == "tool 'execute' disapproved: not on a Friday"

            page.goto(f"{server.url}/ui/runs/deploy-1")  # a run's page: its history and its conversation
            expect(page.locator("#run-id")).to_have_text("deploy-1")
            expect(page.locator("#history tr")).to_have_count(len(done["history"]))
            expect(page.locator("#messages")).to_contain_text("ran echo deployed")
            expect(page.locator("#events li").first).to_contain_text("snapshot: completed")
            context.close()
        assert server.ran() == ["echo deployed"]
    finally:
        output = server.stop()
    assert TOKEN not in output, "the token appeared in the server's output"
    assert "GET /ui" in output  # the output was really collected (uvicorn's access log)


def test_hostile_text_cannot_spoof_or_break_the_page(tmp_path):
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    from service_support import raw_input

    bidi = "echo hello \u202e\u2066; rm -rf ~/ \u2069 \u2066#\u2069\u202c"
    with ServeProcess(tmp_path, token=TOKEN) as server, server.client() as api, sync_playwright() as pw:
        def paused(cid: str, *calls: tuple[str, str]) -> dict:
            r = api.post("/runs", json={"agent": "raw", "input": raw_input(*calls), "checkpoint_id": cid,
                                        "wait": True})
            assert r.status_code == 201, r.text
            return r.json()

        plain = paused("plain", ("execute", '{"command": "uptime"}'))
        spoof = paused("spoof", ("execute", json.dumps({"command": bidi}, ensure_ascii=False)))
        lone = paused("lone", ("execute", '{"command": "ls \\ud800"}'))
        named = paused("run \u202eevil", ("exe\u200bcute", '{"command": "id"}'))
        only_id = paused("plain run\u2066", ("execute", '{"command": "date"}'))  # nothing else is hostile
        classes = "b\u2028c\u2029d\ue000e\ufe0ff\u3164g\U000e0041h"  # Zl, Zp, Co, ignorables, a tag (Cf)
        every = paused("classes", ("execute", json.dumps({"command": classes}, ensure_ascii=False)))
        # (a control character never reaches the page raw: run IDs refuse it, JSON text writes it escaped)
        failed = paused("half", ("execute", '{"command": "fail"}'), ("execute", '{"command": "echo half"}'))
        bad = next(i for i in failed["interrupts"] if i["arguments"]["command"] == "fail")
        r = api.post("/runs/half/resume", json={"answers": [{"action": "approve", "interrupt_id": bad["id"],
                                                             "digest": bad["digest"]}], "wait": True})
        assert r.json()["status"] == "failed"

        context, page = _page(pw, chromium, tmp_path, server.url, TOKEN)

        def card(run: dict, n: int = 0):
            return page.locator(f"#approvals li.card[data-interrupt='{run['interrupts'][n]['id']}']"
                                f"[data-run={json.dumps(run['checkpoint_id'], ensure_ascii=False)}]")

        failed = api.get("/runs/half").json()  # the answered pause is asked again under a new ID

        expect(page.locator("#approvals li.card")).to_have_count(8)  # one bad run hides no other
        expect(card(plain).locator(".warning")).to_have_count(0)
        spoofed = card(spoof)
        expect(spoofed.locator(".warning")).to_contain_text("invisible or direction-changing")
        expect(spoofed.locator("pre.arguments mark.hidden-char")).to_have_count(6)
        text = spoofed.locator("pre.arguments").inner_text()
        assert "\\u202e" in text and "\\u2066" in text and "\u202e" not in text  # shown, not obeyed
        assert text.index("rm -rf") < text.index("#")  # it reads in the order it runs
        expect(card(lone).locator("pre.arguments")).to_contain_text("ls \\ud800")
        expect(card(named).locator(".tool")).to_have_text("exe\\u200bcute")
        expect(card(named).locator(".run-link")).to_have_text("run \\u202eevil")
        expect(card(named).locator(".warning")).to_have_count(1)
        expect(card(only_id).locator(".warning")).to_have_count(1)  # its run ID alone hides a character
        expect(card(only_id).locator(".run-link")).to_have_text("plain run\\u2066")
        marked = card(every).locator("pre.arguments mark.hidden-char")
        expect(marked).to_have_count(6)  # every class the page highlights, each shown by its code
        for code in ("\\u2028", "\\u2029", "\\ue000", "\\ufe0f", "\\u3164", "\\u{e0041}"):
            expect(card(every).locator("pre.arguments")).to_contain_text(code)
        expect(card(every).locator(".warning")).to_have_count(1)
        for n in range(2):
            expect(card(failed, n).locator(".failure")).to_contain_text("the disk is full")

        page.goto(server.url + "/ui/runs/" + quote("run \u202eevil", safe=""))
        expect(page.locator("#run-id")).to_have_text("run \\u202eevil")
        expect(page.locator("#approvals li.card .warning")).to_have_count(1)
        context.close()
        assert "id" not in server.ran() and server.ran() == []


def test_a_runs_page_reads_the_run_at_most_once_a_second_and_pages_its_history(tmp_path):
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    with ServeProcess(tmp_path, token=TOKEN) as server, server.client() as api, sync_playwright() as pw:
        context, page = _page(pw, chromium, tmp_path, server.url, TOKEN)
        expect(page.locator("#live")).to_have_text("live")
        r = api.post("/runs", json={"agent": "steps", "input": {"n": 12, "pause": 0.25}, "checkpoint_id": "slow"})
        assert r.status_code == 201
        reads: list[str] = []
        page.on("request", lambda req: reads.append(req.url) if req.url.endswith("/runs/slow") and "/ui/" not in req.url
                else None)
        page.goto(f"{server.url}/ui/runs/slow")
        expect(page.locator("dd.status")).to_have_text("completed", timeout=30_000)
        checkpoints = page.locator("#events li.event.checkpoint").count()
        assert checkpoints >= 10 and len(reads) <= checkpoints // 2, (len(reads), checkpoints)
        r = api.post("/runs", json={"agent": "steps", "input": {"n": 30}, "checkpoint_id": "long", "wait": True})
        versions = r.json()["newest_version"]
        page.goto(f"{server.url}/ui/runs/long")
        expect(page.locator("#history tr")).to_have_count(20)  # a page of the history...
        page.click("#older")  # ...and the rest on demand
        expect(page.locator("#history tr")).to_have_count(versions)
        expect(page.locator("#older")).to_be_hidden()
        context.close()


def test_serve_refuses_to_start_without_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WAYPOINT_TOKEN", "WAYPOINT_READ_TOKEN")}
    env["PYTHONPATH"] = str(PROCS)
    waypoint = str(Path(sys.executable).parent / "waypoint")
    out = subprocess.run([waypoint, "serve", "--db", str(tmp_path / "x.db"), "--agents", "service_agent:build"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert out.returncode == 2 and "WAYPOINT_TOKEN" in out.stderr
    out = subprocess.run([waypoint, "serve", "--agents", "no_such_module:agent"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env={**env, "WAYPOINT_TOKEN": TOKEN})
    assert out.returncode == 2 and "no_such_module" in out.stderr and TOKEN not in out.stderr
    assert not (tmp_path / "x.db").exists()


def test_a_card_shows_the_call_exactly_as_it_runs_and_whose_call_it_is(tmp_path):
    """The arguments are shown as the model wrote them, never through the browser's doubles (a big account
    number read 12345678901234567000 while 12345678901234567891 ran); a key named twice is flagged; a call
    of an agent used as a tool says which agent asks."""
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    from service_support import SERVED, raw_input

    with ServeProcess(tmp_path, token=TOKEN, agents=SERVED + ",service_agent:boss") as server, server.client() as api, \
            sync_playwright() as pw:
        def paused(cid: str, agent: str, text: str) -> dict:
            r = api.post("/runs", json={"agent": agent, "input": text, "checkpoint_id": cid, "wait": True})
            assert r.status_code == 201 and r.json()["status"] == "interrupted", r.text
            return r.json()["interrupts"][0]

        big = paused("pay", "raw", raw_input(("transfer", '{"account": 12345678901234567891,\n"amount":9007199254740993}')))
        twice = paused("twice", "raw", raw_input(("execute", '{"command": "ls", "command": "rm -rf /"}')))
        nested = paused("nested", "boss", "uptime")
        assert nested["run_path"] == ["boss", "researcher"] and big["run_path"] == ["raw"]
        context, page = _page(pw, chromium, tmp_path, server.url, TOKEN)

        def card(item: dict):
            return page.locator(f"#approvals li.card[data-interrupt='{item['id']}']")

        expect(card(big).locator("pre.arguments")).to_have_text(
            '{\n  "account": 12345678901234567891,\n  "amount": 9007199254740993\n}')
        expect(card(big).locator(".warning")).to_have_count(0)
        expect(card(big).locator(".agent")).to_have_count(0)  # the agent served asks: nothing to say
        expect(card(twice).locator("pre.arguments")).to_have_text('{\n  "command": "ls",\n  "command": "rm -rf /"\n}')
        expect(card(twice).locator(".warning")).to_contain_text('"command" more than once: the tool gets the last')
        expect(card(nested).locator(".agent")).to_have_text("Agent: boss › researcher")
        expect(card(nested).locator("pre.arguments")).to_have_text('{\n  "command": "uptime"\n}')

        card(big).locator("button.approve").click()
        expect(page.locator(f"#answered li[data-interrupt='{big['id']}'] .outcome")).to_contain_text("approved")
        _until(api, "pay", "completed")
        assert server.ran() == ["transfer account=12345678901234567891 amount=9007199254740993"]  # what was shown

        page.goto(f"{server.url}/ui/runs/pay")  # the conversation shows the call as written too
        expect(page.locator("#messages")).to_contain_text('transfer({"account": 12345678901234567891,\n'
                                                          '"amount":9007199254740993})')
        context.close()
