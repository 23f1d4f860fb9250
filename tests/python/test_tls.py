"""TLS from outside: `serve --tls-cert/--tls-key` with a certificate the test makes (the
`test-certs` binary built beside the orchestrator: a CA of its own and a certificate for
127.0.0.1), reached with Python's `websockets` and `httpx` trusting that CA (and refused without
it), and the MCP adapter serving HTTPS with its upstream connection over wss://, called with the
official MCP client."""

import asyncio
import pathlib
import signal
import ssl

import httpx
import pytest
import websockets
from httpx_sse import connect_sse

from conftest import BIN, Client, Server, make_certs, run, spawn_listening

MCP_BIN = str(pathlib.Path(BIN).with_name("orchestrator-mcp"))


@pytest.fixture
def tls_server(tmp_path):
    certs = make_certs(tmp_path, "py")
    s = Server(tmp_path / "tls.db")
    s.tokens = {"admin": s.token("admin", admin=True), "alice": s.token("alice"), "bob": s.token("bob")}
    s.start("127.0.0.1:0", "--tls-cert", certs["cert"], "--tls-key", certs["key"])
    s.certs = certs
    s.ssl = ssl.create_default_context(cafile=certs["ca"])
    yield s
    s.stop(signal.SIGKILL)


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def test_websockets_and_httpx_over_tls_trusting_the_ca_and_refused_without_it(tls_server):
    s = tls_server
    assert s.url.startswith("wss://") and s.http.startswith("https://")
    r = httpx.post(f"{s.http}/conversations", headers=auth(s.tokens["admin"]), verify=s.ssl,
                   json={"conversationId": "tls", "participants": ["alice", "bob"]})
    assert r.status_code == 201, r.text

    async def over_websocket():
        alice = await Client.connect(s.url, s.tokens["alice"], ssl=s.ssl)
        sub = await alice.call("subscribe", {"conversationId": "tls", "sinceSeq": 0})
        assert sub is not None
        first = await alice.next_event()
        assert first["seq"] == 1
        # A message over HTTPS reaches the subscriber on wss://.
        r = await asyncio.to_thread(
            httpx.post, f"{s.http}/conversations/tls/messages", headers=auth(s.tokens["bob"]), verify=s.ssl,
            json={"payload": {"text": "over https"}, "finality": "none"})
        assert r.status_code == 201, r.text
        ev = await alice.next_event()
        assert ev["seq"] == r.json()["seq"] and ev["payload"]["text"] == "over https"
        sent = await alice.call("sendMessage", {"conversationId": "tls", "payload": {"text": "over wss"},
                                                "finality": "none", "clientRequestId": "k1"})
        await alice.close()
        return sent["seq"]

    seq = run(over_websocket())
    # SSE over HTTPS replays the log.
    with httpx.Client(verify=s.ssl, timeout=httpx.Timeout(10, read=10)) as c:
        with connect_sse(c, "GET", f"{s.http}/conversations/tls/events", headers=auth(s.tokens["bob"])) as es:
            seen = []
            for sse in es.iter_sse():
                seen.append(sse.json()["seq"])
                if seen[-1] == seq:
                    break
    assert seen == list(range(1, seq + 1))

    # Without the CA: both clients refuse the server's certificate.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{s.http}/healthz")
    with pytest.raises(ssl.SSLCertVerificationError):
        run(websockets.connect(s.url))
    # Plain ws:// and http:// to the TLS port get no answer.
    with pytest.raises(httpx.TransportError):
        httpx.get(s.http.replace("https://", "http://") + "/healthz", timeout=5)


def test_mcp_adapter_serves_https_and_reaches_the_server_over_wss(tls_server, tmp_path):
    import httpx2
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    s = tls_server
    s.tokens["user"] = s.token("user")
    r = httpx.post(f"{s.http}/conversations", headers=auth(s.tokens["admin"]), verify=s.ssl,
                   json={"conversationId": "mcp-tls", "participants": ["user"]})
    assert r.status_code == 201, r.text
    own = make_certs(tmp_path, "mcp")
    proc, url = spawn_listening(
        [MCP_BIN, "--url", s.url, "--http", "127.0.0.1:0", "--http-token", "tls-token",
         "--tls-cert", own["cert"], "--tls-key", own["key"]],
        r"(https://\S+/mcp)", token=s.tokens["user"], env={"ORCHESTRATOR_CA_FILE": s.certs["ca"]})
    try:
        async def main():
            client = httpx2.AsyncClient(headers={"Authorization": "Bearer tls-token"}, verify=ssl.create_default_context(cafile=own["ca"]), timeout=30)
            async with McpClient(streamable_http_client(url, http_client=client)) as mcp:
                r = await mcp.call_tool("post_message", {"conversationId": "mcp-tls", "text": "through both TLS hops", "finality": "none"})
                assert not r.is_error, r

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    async def read():
        admin = await Client.connect(s.url, s.tokens["admin"], ssl=s.ssl)
        page = await admin.call("tail", {"conversationId": "mcp-tls", "sinceSeq": 0})
        await admin.close()
        return [e["payload"].get("text") for e in page["events"]]

    assert "through both TLS hops" in run(read())


def test_the_python_sdk_over_wss_trusting_the_ca(tls_server):
    """The SDK's `Client` reaches `wss://` with a custom CA (`ssl=`), and is refused without it."""
    from orchestrator_sdk import Client as SdkClient

    s = tls_server

    async def main():
        admin = await SdkClient.connect(s.url, s.tokens["admin"], ssl=s.ssl)
        await admin.create_conversation(conversationId="sdk-tls", participants=["alice"])
        alice = await SdkClient.connect(s.url, s.tokens["alice"], ssl=s.ssl)
        r = await alice.send_message("sdk-tls", "over tls", "none")
        assert r["seq"] == 2
        for c in (admin, alice):
            await c.close()
        # Without the CA (the system's only) the certificate is refused, at once: reconnecting
        # would not help.
        with pytest.raises(ssl.SSLCertVerificationError):
            await SdkClient.connect(s.url, s.tokens["alice"])

    run(main())
