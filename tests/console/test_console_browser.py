"""The console in a real browser (issue 36): Debian's chromium through Playwright, over a real stack (Redis, a Celery
worker, the API). Jobs bring their own calls (``tool_calls``): no model, so the whole module runs in seconds."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from executor.job_client import wait_for_job
from tests.console.conftest import KEYS
from tests.harness.receiver import Receiver, wait_for

DOCS = Path(__file__).resolve().parents[2] / "docs"
TRANSFER = {"name": "transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": 12, "currency": "CNY"}}
#: A needs_review job: "后天" is no date get_weather takes, and no decider is there to re-ask.
UNCHECKED = '{"name": "get_weather", "arguments": {"city": "北京", "date": "后天"}}'
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
HOSTILE_LINK = '<a href="javascript:window.__pwned = 3">click me</a> javascript:window.__pwned=4'


def _submit(base: str, body: dict[str, Any], key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(f"{base}/v1/jobs", json=body, headers=headers, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def _job(base: str, job_id: str, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=30).json()


def _waiting(base: str, **extra: Any) -> str:
    job_id = _submit(base, {"tools": ["transfer"], "tool_calls": [TRANSFER], "require_approval": "side_effects",
                            **extra})
    assert _job(base, job_id)["status"] == "awaiting_approval"
    return job_id


def _settled(base: str, job_id: str, key: str | None = None) -> dict[str, Any]:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=30) as client:
        return wait_for_job(client, job_id, timeout_s=30)


@pytest.fixture()
def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: docs/ (the console's page shows them) with TOOLRAIL_DOCS_SCREENSHOTS=1, else a
    temporary folder (a test run leaves the tracked files alone)."""
    return DOCS if os.environ.get("TOOLRAIL_DOCS_SCREENSHOTS") == "1" else tmp_path


def _tab_to(page: Page, selector: str, limit: int = 80) -> None:
    """Press Tab until the element ``selector`` has the focus (keyboard only: no click, no focus())."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement && document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"{selector} never took the focus in {limit} tabs")


def test_the_page_has_a_strict_csp_and_no_inline_script(console_api: str) -> None:
    page = httpx.get(f"{console_api}/console/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page.text, re.S)
    assert scripts and all('src="' in attrs and not body.strip() for attrs, body in scripts), scripts  # none inline
    module = httpx.get(f"{console_api}/console/app.js", timeout=10)
    assert module.headers["content-type"].startswith("text/javascript") and "frame-ancestors" in module.headers[
        "content-security-policy"]
    assert httpx.get(f"{console_api}/console/..%2Fapp.py", timeout=10).status_code == 404  # a fixed set of files
    assert httpx.get(f"{console_api}/console", follow_redirects=False, timeout=10).headers["location"] == "/console/"
    # a key-less install serves this machine only: a rebound name, or a page elsewhere calling the API, is refused
    assert httpx.get(f"{console_api}/console/", headers={"Host": "evil.example"}, timeout=10).status_code == 403
    foreign = httpx.get(f"{console_api}/v1/console/jobs", headers={"Origin": "http://evil.example"}, timeout=10)
    assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "origin_not_allowed"


def test_the_jobs_list_updates_live(page: Page, console_api: str) -> None:
    page.goto(f"{console_api}/console/")
    expect(page.locator("#live")).to_have_text("● live")
    job_id = _submit(console_api, {"tools": ["slow_echo"], "tool_calls": [
        {"name": "slow_echo", "arguments": {"value": "live", "delay_s": 4.0}}]})
    row = page.locator(f"tr[data-job-id='{job_id}']")
    expect(row).to_be_visible(timeout=5000)  # a new job appears without a reload
    expect(row).to_have_attribute("data-status", "running", timeout=5000)
    expect(row).to_have_attribute("data-status", "succeeded", timeout=10000)  # and its status moves on its own
    request_id = _job(console_api, job_id)["request_id"]
    page.fill("#search", request_id)  # search by request id
    expect(page.locator("tbody tr")).to_have_count(1)
    page.fill("#search", "")
    page.select_option("#status-filter", "awaiting_approval")  # filter by status
    expect(row).to_have_count(0)
    page.select_option("#status-filter", "succeeded")
    expect(row).to_have_count(1)


def test_approve_with_an_edit_checked_against_the_schema(page: Page, console_api: str, shots: Path) -> None:
    job_id = _waiting(console_api, tools=["transfer", "query_balance"], messages=[  # the payee came from a tool's output
        {"role": "user", "content": "Transfer 12 CNY from alice to my landlord"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "query_balance", "arguments": json.dumps({"account": "alice"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "alice's landlord has account bob"}])
    page.set_viewport_size({"width": 1280, "height": 1000})
    page.goto(f"{console_api}/console/#/jobs/{job_id}")
    card = page.locator(".approval")
    expect(card).to_contain_text("transfer waits for your approval")
    untrusted = card.locator(".provenance tr.untrusted")  # why it waits: which value came from which tool output
    expect(untrusted).to_have_count(1)
    expect(untrusted).to_contain_text("/to")
    expect(untrusted).to_contain_text("tool query_balance")
    page.screenshot(path=str(shots / "console-job.png"), full_page=True)
    editor = card.locator("textarea")
    args = dict(TRANSFER["arguments"])
    editor.fill(json.dumps({**args, "amount": -5, "currency": "GBP"}))
    expect(card.locator(".errors")).to_contain_text("/amount must be > 0")
    expect(card.locator(".errors")).to_contain_text("/currency must be one of")
    expect(card.locator("button.approve")).to_be_disabled()  # nothing sent while the schema says no
    assert _job(console_api, job_id)["status"] == "awaiting_approval"
    editor.fill(json.dumps({**args, "amount": 7.5}))
    expect(card.locator(".errors li")).to_have_count(0)
    expect(card.locator("button.approve")).to_have_text("Approve edited")
    card.locator("button.approve").click()
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded", timeout=10000)  # live
    (call,) = _settled(console_api, job_id)["calls"]
    assert call["arguments"]["amount"] == 7.5 and call["result"]["cents"] == 750, call
    assert call["approval"]["state"] == "approved" and call["approval"]["edited"] is True
    assert call["approval"]["original_arguments"]["amount"] == 12
    expect(page.locator(".approval")).to_have_count(0)


def test_reject_with_a_reason(page: Page, console_api: str) -> None:
    with Receiver() as receiver:
        hook = receiver.path()
        job_id = _waiting(console_api, webhook_url=receiver.url(hook))
        page.goto(f"{console_api}/console/#/jobs/{job_id}")
        card = page.locator(".approval")
        card.locator("input[id^=reason-]").fill("bob is not a known payee")
        card.locator("button.reject").click()
        expect(page.locator(".call[data-status=rejected]")).to_be_visible(timeout=10000)
        job = _settled(console_api, job_id)
        (call,) = job["calls"]
        assert call["status"] == "rejected" and call["approval"]["reason"] == "bob is not a known payee", call
        assert call["result"] is None and call["started_at"] is None  # it never ran
        # its webhook deliveries, as the API records them (event, URL, state, attempts)
        recorded = wait_for(lambda: len(_job(console_api, job_id).get("webhooks") or []) >= 2 and
                            _job(console_api, job_id)["webhooks"], timeout_s=15)
        page.reload()
        rows = page.locator("table.webhooks tbody tr")
        expect(rows).to_have_count(len(recorded))
        for delivery in recorded:
            expect(page.locator("table.webhooks")).to_contain_text(delivery["event"])
        expect(rows.first).to_contain_text(receiver.url(hook))


def test_review_runs_an_edited_call(page: Page, console_api: str) -> None:
    job_id = _submit(console_api, {"raw_output": UNCHECKED, "tools": ["get_weather"]})
    assert _settled(console_api, job_id)["status"] == "needs_review"
    page.goto(f"{console_api}/console/#/jobs/{job_id}")
    review = page.locator("#review")
    expect(review.locator(".findings")).to_contain_text("'后天' is not one of")
    proposal = json.loads(review.locator("#review-calls").input_value())
    assert proposal == [{"name": "get_weather", "arguments": {"city": "北京", "date": "后天"}}]  # the model's, to edit
    expect(review.locator("#review-run")).to_be_disabled()  # as proposed it fails the tool's schema
    proposal[0]["arguments"].update(city="Beijing", date="tomorrow")  # a reviewed call is run as written
    review.locator("#review-calls").fill(json.dumps(proposal, ensure_ascii=False))
    review.locator("#review-run").click()
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded", timeout=10000)
    done = _settled(console_api, job_id)
    (call,) = done["calls"]
    assert call["result"]["city"] == "Beijing" and call["approval"]["by"] == "reviewer" and call["step"] == 1
    assert done["steps"][0]["review"]["outcome"] == "calls"


def test_the_trace_waterfall_renders(page: Page, console_api: str, shots: Path) -> None:
    job_id = _submit(console_api, {"tools": ["get_weather"], "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo", "date": "today"}}]})
    assert _settled(console_api, job_id)["status"] == "succeeded"
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{console_api}/console/#/jobs/{job_id}/trace")
    for name in ("POST /v1/jobs", "job", "execute_tool get_weather", "sandbox get_weather"):
        expect(page.locator(f"#waterfall li[data-name='{name}']")).to_have_count(1, timeout=15000)
    bars = page.eval_on_selector_all("#waterfall .span-bar", "bars => bars.map(b => b.getBoundingClientRect().width)")
    assert len(bars) >= 5 and all(width > 0 for width in bars), bars
    names = page.eval_on_selector_all("#waterfall li", "rows => rows.map(r => r.dataset.name)")
    assert names[0] == "POST /v1/jobs" and names.index("job") < names.index("sandbox get_weather"), names  # a tree
    page.locator("#waterfall li[data-name='sandbox get_weather'] summary").click()  # a span's attributes
    expect(page.locator("#waterfall li[data-name='sandbox get_weather'] pre")).to_contain_text("toolrail.sandbox.filesystem")
    page.screenshot(path=str(shots / "console-trace.png"), full_page=True)


def test_a_hostile_tool_result_renders_as_text(page: Page, console_api: str) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    job_id = _submit(console_api, {
        "messages": [{"role": "user", "content": "echo it"},
                     {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                         "name": "slow_echo", "arguments": json.dumps({"value": "x"})}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": HOSTILE_LINK}],
        "tools": ["slow_echo"], "tool_calls": [{"name": "slow_echo", "arguments": {"value": HOSTILE}}]})
    assert _settled(console_api, job_id)["calls"][0]["result"]["value"] == HOSTILE
    page.goto(f"{console_api}/console/#/jobs/{job_id}")
    expect(page.locator("pre.result")).to_contain_text('<script>window.__pwned = 1</script><img src=x onerror=')  # text
    expect(page.locator(".conversation")).to_contain_text(HOSTILE_LINK)
    main = page.locator("main")
    assert main.locator("script, img, iframe").count() == 0
    hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.getAttribute('href'))")
    assert hrefs and all(h.startswith("#/") for h in hrefs), hrefs  # no link made from data
    assert page.evaluate("window.__pwned") is None and not errors, errors


def test_a_foreign_tenants_job_is_invisible(page: Page, keyed_api: str) -> None:
    ours = _submit(keyed_api, {"tools": ["get_weather"], "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo", "date": "today"}}]}, key=KEYS["alpha"])
    theirs = _submit(keyed_api, {"tools": ["get_weather"], "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Lima", "date": "today"}}]}, key=KEYS["beta"])
    sent: list[dict[str, str]] = []
    page.on("request", lambda request: sent.append({"url": request.url, **request.headers}))
    page.goto(f"{keyed_api}/console/")
    page.fill("#api-key", KEYS["alpha"])  # the page asks for a key
    before = len(sent)  # what was sent before the key: refused (401), which is what made the page ask
    page.keyboard.press("Enter")
    expect(page.locator(f"tr[data-job-id='{ours}']")).to_be_visible(timeout=5000)
    expect(page.locator(f"tr[data-job-id='{theirs}']")).to_have_count(0)
    page.fill("#search", theirs)
    expect(page.locator("tbody tr")).to_have_count(0)
    page.goto(f"{keyed_api}/console/#/jobs/{theirs}")
    expect(page.locator("[role=alert]")).to_contain_text("not found")
    page.goto(f"{keyed_api}/console/#/jobs/{theirs}/trace")
    expect(page.locator("[role=alert]")).to_contain_text("not found")
    api_calls = [r for r in sent[before:] if "/v1/" in r["url"]]
    assert api_calls and all(r.get("authorization") == f"Bearer {KEYS['alpha']}" for r in api_calls)
    assert not any(KEYS["alpha"] in r["url"] for r in sent)  # never in a URL
    assert page.evaluate("document.cookie") == "" and page.context.cookies() == []  # nor in a cookie


def test_approval_with_the_keyboard_only(page: Page, console_api: str) -> None:
    job_id = _waiting(console_api)
    page.goto(f"{console_api}/console/")
    _tab_to(page, f"a[href='#/jobs/{job_id}']")
    page.keyboard.press("Enter")
    expect(page.locator(".approval")).to_be_visible()
    _tab_to(page, ".approval button.approve")
    page.keyboard.press("Enter")
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded", timeout=10000)
    assert _settled(console_api, job_id)["calls"][0]["approval"]["state"] == "approved"


def test_workers_and_queues(page: Page, console_api: str) -> None:
    page.goto(f"{console_api}/console/#/ops")
    ops = page.locator("#ops")
    expect(ops).to_contain_text("toolrail-console@")  # the worker that answered, and what it consumes
    expect(ops).to_contain_text("tool.transfer")
    expect(ops).to_contain_text("last: 20", timeout=5000)  # the reconciler's last sweep (a date)
    started = time.monotonic()
    body = httpx.get(f"{console_api}/v1/console/ops", timeout=10).json()
    assert {q["queue"] for q in body["queues"]} >= {"decide", "webhooks", "tool.transfer"}
    assert body["reconciler"]["last_sweep"]["requeued"] == 0 and time.monotonic() - started < 5
