"""Black-box harness: runs the `orchestrator` binary (`ORCHESTRATOR_BIN`, else the debug build
in target/debug) and speaks raw JSON-RPC to it."""

import asyncio
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest
import websockets

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("ORCHESTRATOR_BIN", str(ROOT / "target" / "debug" / "orchestrator"))


def spawn_listening(args, pattern, token=None, env=None):
    """Starts a process that prints the address it listens on in its first line (with
    ORCHESTRATOR_TOKEN set when `token` is given, and the variables of `env`); the process and
    the address."""
    more = dict(env or {}, **({"ORCHESTRATOR_TOKEN": token} if token else {}))
    env = dict(os.environ, **more) if more else None
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(pattern, line)
    assert match, f"no address in {line!r}"
    return proc, match.group(1)


def make_certs(directory, name):
    """A new CA and a server certificate it signed for 127.0.0.1, made by the `test-certs`
    binary built beside the orchestrator: {"ca", "cert", "key"} paths."""
    certs_bin = str(pathlib.Path(BIN).with_name("test-certs"))
    out = subprocess.run([certs_bin, str(directory), name], check=True, capture_output=True, text=True, timeout=30)
    return dict(zip(("ca", "cert", "key"), out.stdout.split()))


def test_database(path):
    """The database a test server runs on: the SQLite file `path`, or, when
    ORCHESTRATOR_TEST_BACKEND=postgres, a new database on the PostgreSQL that
    ORCHESTRATOR_TEST_PG names (scripts/test starts one)."""
    backend = os.environ.get("ORCHESTRATOR_TEST_BACKEND", "sqlite")
    if backend == "sqlite":
        return str(path)
    assert backend == "postgres", f"ORCHESTRATOR_TEST_BACKEND={backend}: expected sqlite or postgres"
    url = os.environ.get("ORCHESTRATOR_TEST_PG")
    assert url, "ORCHESTRATOR_TEST_BACKEND=postgres needs ORCHESTRATOR_TEST_PG (a postgres:// URL)"
    name = f"py_{os.getpid()}_{next(_databases)}_{time.time_ns()}"
    subprocess.run(["psql", url, "-qc", f"CREATE DATABASE {name}"], check=True, timeout=30)
    return url.rsplit("/", 1)[0] + "/" + name


_databases = itertools.count()


class Server:
    """One `orchestrator serve` process over a database of its own (see `test_database`)."""

    def __init__(self, db):
        self.db = test_database(db)
        self.proc = None
        self.url = None

    def token(self, agent, admin=False):
        args = [BIN, "token", "create", "--agent", agent, "--db", self.db]
        if admin:
            args.append("--admin")
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=30).stdout.strip()

    def tenant_token(self, tenant, agent, admin=False):
        """A token of `agent` of `tenant`, the tenant made first if it is new."""
        made = subprocess.run([BIN, "tenant", "create", tenant, "--db", self.db], capture_output=True, text=True, timeout=30)
        assert made.returncode == 0 or "exists already" in made.stderr, made.stderr
        args = [BIN, "token", "create", "--agent", agent, "--tenant", tenant, "--db", self.db]
        if admin:
            args.append("--admin")
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=30).stdout.strip()

    def start(self, listen="127.0.0.1:0", *extra):
        self.proc, self.url = spawn_listening([BIN, "serve", "--listen", listen, "--db", self.db, *extra], r"(wss?://\S+/rpc)")
        # ws:// → http://, wss:// → https:// (serve --tls-cert).
        self.http = "http" + self.url.removeprefix("ws").removesuffix("/rpc")
        self.port = int(self.http.rsplit(":", 1)[1])
        return self

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)
        code = self.proc.returncode if self.proc else None
        self.proc = None
        return code


class Client:
    """A raw JSON-RPC 2.0 client: answers by id, notifications into a queue."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending = {}
        self.notifications = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url, token=None, ssl=None):
        ws = await websockets.connect(url, max_size=None, **({"ssl": ssl} if ssl else {}))
        client = cls(ws)
        if token:
            result = await client.call("authenticate", {"token": token})
            assert result["ok"] is True
        return client

    async def _read(self):
        try:
            async for raw in self.ws:
                msg = json.loads(raw)
                if "id" in msg and msg["id"] in self.pending:
                    self.pending.pop(msg["id"]).set_result(msg)
                else:
                    await self.notifications.put(msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("closed"))

    async def request(self, method, params):
        i = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}))
        return await asyncio.wait_for(fut, 10)

    async def call(self, method, params):
        msg = await self.request(method, params)
        if "error" in msg:
            raise RpcError(msg["error"])
        return msg["result"]

    async def next_event(self, timeout=10):
        msg = await asyncio.wait_for(self.notifications.get(), timeout)
        assert msg["method"] == "event", msg
        return msg["params"]["result"]["event"]

    async def close(self):
        await self.ws.close()
        self.reader.cancel()


class RpcError(Exception):
    def __init__(self, error):
        super().__init__(error)
        self.code = error["code"]
        self.error = error


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "blackbox.db")
    s.tokens = {"admin": s.token("admin", admin=True), "alice": s.token("alice"), "bob": s.token("bob")}
    s.start()
    yield s
    s.stop(signal.SIGKILL)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def wait_until(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False
