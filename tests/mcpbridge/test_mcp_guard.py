"""What an MCP server may send and where toolrail connects: bounded answers, the one SSRF guard at every request.

Real SDK-written servers on loopback (``mcp_servers.serve_http``), in JSON and in event-stream mode.
Addresses that are not loopback only ever come from a resolver double, and a request to one is never
made: the guard refuses it, or a mock transport stands in for the network.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import httpx2
import pytest

from mcpbridge.errors import McpTooLargeError, McpUrlNotAllowedError
from mcpbridge.session import MAX_CALL_BYTES, MAX_LISTING_BYTES, MAX_RESULT_BYTES, Endpoint, call_tool, list_tools
from mcpbridge.transport import GuardedTransport
from tests.mcpbridge.mcp_servers import serve_http
from toolrail import netguard

REFUSED = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "100.127.255.254", "169.254.169.254",
           "0.0.0.0", "198.18.0.1", "224.0.0.1", "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1", "::ffff:127.0.0.1",
           "2002:0a00:0001::1", "2002:5db8:d822::1", "64:ff9b::a00:1", "64:ff9b::5db8:d822", "64:ff9b:1::a00:1",
           "2001:0:4136:e378:8000:63bf:f5ff:fffe", "not-an-address"]
ACCEPTED = ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:93.184.216.34"]


@pytest.fixture(scope="module", params=[True, False], ids=["json", "sse"])
def huge_server(request: pytest.FixtureRequest) -> Iterator[str]:
    url, stop = serve_http("huge", json_response=request.param)
    yield url
    stop()


def _call(url: str, mb: float) -> dict:
    endpoint = Endpoint(server="huge", url=url, allow_private=True)
    return anyio.run(lambda: call_tool(endpoint, "big", {"mb": mb}, tool_name="mcp__huge__big", timeout_s=30,
                                       idle_timeout_s=30))[0]


@pytest.mark.parametrize("address", REFUSED)
def test_the_guard_refuses_every_non_global_address(address: str) -> None:
    assert not netguard.is_public(address)
    with pytest.raises(netguard.UrlRefusedError) as caught:
        netguard.check_url("https://svc.example/x", allow_private=False, resolve=lambda host, port: [address])
    assert caught.value.reason == "not_public" and caught.value.details["address"] == address


@pytest.mark.parametrize("address", ACCEPTED)
def test_the_guard_accepts_global_addresses(address: str) -> None:
    url, addresses = netguard.check_url("https://svc.example/x#f", allow_private=False, resolve=lambda h, p: [address])
    assert addresses == [address] and str(url) == "https://svc.example/x"


def test_one_bad_address_among_good_ones_refuses_the_host() -> None:
    with pytest.raises(netguard.UrlRefusedError):
        netguard.check_host("svc.example", 443, allow_private=False, resolve=lambda h, p: ["93.184.216.34", "10.0.0.1"])
    assert netguard.check_host("svc.example", 443, allow_private=True, resolve=lambda h, p: ["10.0.0.1"]) == ["10.0.0.1"]


def test_the_transport_resolves_pins_and_checks_at_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that answered a public address and then a private one (DNS rebinding): the second request is refused
    before anything is sent; the first went to the checked address with the name as Host and TLS server name."""
    answers = iter([["93.184.216.34"], ["100.64.0.9"]])
    monkeypatch.setattr(netguard, "resolve_host", lambda host, port: next(answers))
    sent: list[httpx2.Request] = []

    def network(request: httpx2.Request) -> httpx2.Response:  # stands in for the internet: nothing is connected
        sent.append(request)
        return httpx2.Response(200, json={"ok": True})

    async def main() -> None:
        transport = GuardedTransport(max_bytes=1024, allow_private=False, inner=httpx2.MockTransport(network))
        async with httpx2.AsyncClient(transport=transport) as client:
            first = await client.post("https://mcp.example.test:8443/mcp", json={})
            assert first.json() == {"ok": True}
            with pytest.raises(netguard.UrlRefusedError):
                await client.post("https://mcp.example.test:8443/mcp", json={})

    anyio.run(main)
    assert len(sent) == 1
    assert sent[0].url.host == "93.184.216.34" and sent[0].headers["host"] == "mcp.example.test:8443"
    assert sent[0].extensions["sni_hostname"] == "mcp.example.test"


def test_a_result_under_the_cap_comes_back(huge_server: str) -> None:
    assert len(_call(huge_server, 0.5)["blob"]) == 512 * 1024


def test_a_result_over_the_sandbox_cap_is_refused(huge_server: str) -> None:
    with pytest.raises(McpTooLargeError) as caught:
        _call(huge_server, 1.5)  # under the wire limit (it carries the result twice), over the result's 1 MB
    assert caught.value.details["limit_bytes"] == MAX_RESULT_BYTES and caught.value.details["tool"] == "big"


def test_a_huge_answer_is_cut_on_the_wire(huge_server: str) -> None:
    with pytest.raises(McpTooLargeError) as caught:
        _call(huge_server, 40)  # 40 MB of structuredContent: never read past the limit
    assert caught.value.details["limit_bytes"] == MAX_CALL_BYTES and caught.value.type == "mcp_too_large"


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
def test_a_listing_over_16_mib_is_refused(json_response: bool) -> None:
    url, stop = serve_http("huge_list", json_response=json_response)
    try:
        with pytest.raises(McpTooLargeError) as caught:
            anyio.run(lambda: list_tools(Endpoint(server="wide", url=url, allow_private=True)))
    finally:
        stop()
    assert caught.value.details["limit_bytes"] == MAX_LISTING_BYTES


def test_every_connection_is_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing and calling each resolve the name again, connect to the address checked then, and refuse it once the
    name answers a non-global address (a real SDK server, named through a resolver double)."""
    url, stop = serve_http("good", any_host=True)
    port = url.split(":")[2].split("/")[0]
    named = f"http://mcp-rebind.test:{port}/mcp"
    asked: list[str] = []
    answer = ["127.0.0.1"]

    def resolver(host: str, _port: int) -> list[str]:
        asked.append(host)
        return list(answer)

    monkeypatch.setattr(netguard, "resolve_host", resolver)
    loopback_ok = Endpoint(server="rebind", url=named, allow_private=True)  # the operator allows private addresses
    guarded = Endpoint(server="rebind", url=named, allow_private=False)
    try:
        names = {t["name"] for t in anyio.run(lambda: list_tools(loopback_ok))}
        assert "add" in names and set(asked) == {"mcp-rebind.test"}
        before = len(asked)
        value, _ = anyio.run(lambda: call_tool(loopback_ok, "add", {"a": 1, "b": 2}, tool_name="mcp__rebind__add",
                                               timeout_s=10, idle_timeout_s=10))
        assert value == {"sum": 3} and len(asked) > before  # the call resolved again
        answer[:] = ["100.64.0.7"]
        for attempt in (lambda: list_tools(guarded),
                        lambda: call_tool(guarded, "add", {"a": 1, "b": 2}, tool_name="mcp__rebind__add", timeout_s=10,
                                          idle_timeout_s=10)):
            with pytest.raises(McpUrlNotAllowedError) as caught:
                anyio.run(attempt)
            assert caught.value.details["address"] == "100.64.0.7" and caught.value.type == "mcp_url_not_allowed"
    finally:
        stop()


def _stdio(kind: str) -> Endpoint:
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "mcp_servers.py"
    return Endpoint(server=kind.replace("_", ""), command=(sys.executable, str(script), "stdio", kind), memory_mb=2048,
                    read_paths=(str(script.parent),))


def test_stdio_answers_are_bounded_too() -> None:
    """A stdio server's answer is one line: its relay stops the server at the limit, so the worker never holds more;
    under it, the decoded result's 1 MB cap applies as over HTTP."""
    endpoint = _stdio("huge")

    def call(mb: float) -> dict:
        return anyio.run(lambda: call_tool(endpoint, "big", {"mb": mb}, tool_name="mcp__huge__big", timeout_s=60,
                                           idle_timeout_s=60, connect_timeout_s=30))[0]

    assert len(call(0.5)["blob"]) == 512 * 1024
    with pytest.raises(McpTooLargeError) as small:
        call(1.5)
    assert small.value.details["limit_bytes"] == MAX_RESULT_BYTES
    with pytest.raises(McpTooLargeError) as huge:
        call(40)
    assert huge.value.details["limit_bytes"] == MAX_CALL_BYTES and huge.value.details["tool"] == "big"
    with pytest.raises(McpTooLargeError) as listing:
        anyio.run(lambda: list_tools(_stdio("huge_list"), timeout_s=30))
    assert listing.value.details["limit_bytes"] == MAX_LISTING_BYTES
