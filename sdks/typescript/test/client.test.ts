/**
 * The client against the real server: every method, typed errors, a push replica's offer and
 * claim, and its guarantees through a proxy that cuts connections: a subscription resumes with
 * no gap and no duplicate, and a write cut before its answer lands once.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";

import { AuthenticationFailed, Client, ErrorCode, RpcError } from "../src/index.js";
import { CuttingProxy, makeCerts, ROOT, Server, sleep, wholeLog } from "./harness.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(() => server.stop());

const ROUND_ROBIN = { participants: ["alice", "bob"], policy: { order: "round_robin", first: "alice" } };

async function refusal(work: Promise<unknown>): Promise<RpcError> {
  try {
    await work;
  } catch (e) {
    assert.ok(e instanceof RpcError, `an RpcError, not ${String(e)}`);
    return e;
  }
  assert.fail("the call was not refused");
}

test("the SDK's error codes are the protocol's", () => {
  const spec = JSON.parse(readFileSync(path.join(ROOT, "proto-spec", "openrpc.json"), "utf8")) as {
    "x-errors": Array<{ name: string; code: number }>;
  };
  const wire = Object.fromEntries(spec["x-errors"].map((e) => [e.name, e.code]));
  assert.deepEqual({ ...ErrorCode }, wire);
});

test("the wire types are what the protocol's JSON Schemas generate", () => {
  // scripts/gen-sdk-types --check fails when src/wire.ts (or the Python SDK's wire.py) and
  // proto-spec/schemas drift apart.
  const checked = spawnSync("python3", [path.join(ROOT, "scripts", "gen-sdk-types"), "--check"], { encoding: "utf8" });
  assert.equal(checked.status, 0, checked.stderr);
});

test("every method, and typed errors", async () => {
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  const bob = await Client.connect(server.url, server.tokens.bob!);
  assert.equal(alice.agentId, "alice");
  const made = await admin.createConversation({ conversationId: "c1", scenario: ROUND_ROBIN });
  assert.deepEqual(made, { conversationId: "c1" });
  const sub = await bob.subscribe("c1", 0);
  const first = await sub.next(10_000);
  assert.equal(first.conversationId, "c1");
  assert.equal(first.event.seq, 1);

  // Not bob's turn: a typed refusal with the protocol's code and data.
  const refused = await refusal(bob.sendMessage("c1", "me first"));
  assert.equal(refused.code, ErrorCode.NotYourTurn);
  assert.equal((refused.data as { error: string }).error, "NotYourTurn");

  const snap = await alice.getConversation("c1");
  const r = await alice.sendMessage("c1", "hello", "turn", { turnHint: snap.turn, clientRequestId: "k1" });
  assert.equal(r.duplicate, false);
  const again = await alice.sendMessage("c1", "hello", "turn", { turnHint: snap.turn, clientRequestId: "k1" });
  assert.deepEqual(again, { ...r, duplicate: true }, "a retried key answers the original");
  const trace = await alice.sendTrace("c1", { type: "note", text: "thinking" });
  assert.ok(trace.seq > r.seq);

  const updates = await bob.getUpdates("c1", { sinceSeq: 0, timeoutMs: 0 });
  assert.deepEqual(
    updates.messages.map((m) => (m.payload as { text: string }).text),
    ["hello"],
  );
  assert.equal(updates.guidance.status, "may_speak");
  const changed = await bob.waitForChange("c1", 0, 1000);
  assert.equal(changed.timedOut, false);
  const tail = await bob.tail("c1", 0, 2);
  assert.deepEqual(
    tail.events.map((e) => e.seq),
    [1, 2],
  );
  const listed = await bob.listConversations();
  assert.deepEqual(
    listed.conversations.map((c) => c.conversationId),
    ["c1"],
  );
  assert.deepEqual((await admin.listScenarios()).scenarios, []);
  assert.equal((await refusal(bob.listScenarios())).code, ErrorCode.Forbidden);

  // A tenant's admin mints, lists and revokes its tokens (the token shown once).
  const minted = await admin.createToken({ agentId: "ts-token-agent", expiresIn: "1m" });
  assert.ok(minted.token.startsWith("oct_") && minted.tenant === "default" && minted.expiresMs);
  const tokens = (await admin.listTokens()).tokens;
  assert.ok(tokens.some((t) => t.id === minted.id));
  assert.ok(!JSON.stringify(tokens).includes(minted.token.slice(4)));
  assert.equal((await admin.revokeToken({ id: minted.id })).revoked, 1);
  assert.equal((await admin.revokeToken({ agentId: "ts-token-agent" })).revoked, 0);
  assert.equal((await refusal(bob.listTokens())).code, ErrorCode.Forbidden);
  // A tenant's quotas are an operator's to set.
  assert.equal(
    (await refusal(admin.setTenantQuotas("default", { connections: 1 }))).code,
    ErrorCode.Forbidden,
  );

  await admin.pauseConversation("c1");
  assert.equal((await refusal(bob.sendMessage("c1", "while paused"))).code, ErrorCode.ConversationPaused);
  await admin.resumeConversation("c1");
  const fork = await admin.forkConversation("c1", 2, "c1-fork");
  assert.equal(fork.conversationId, "c1-fork");

  const seen: number[] = [];
  for (let i = 0; i < tail.latestSeq - 1; i++) seen.push((await sub.next(10_000)).event.seq);
  assert.deepEqual(
    seen,
    Array.from({ length: tail.latestSeq - 1 }, (_, i) => i + 2),
  );
  assert.equal(await bob.unsubscribe(sub), true);
  // Iteration ends once the subscription has, after what it held (the pause and resume).
  const rest: number[] = [];
  for await (const item of sub) rest.push(item.event.seq);
  assert.ok(rest.length <= 2);
  assert.deepEqual(
    rest,
    rest.map((_, i) => seen[seen.length - 1]! + 1 + i),
  );

  // A deleted conversation: its subscription ends with the error, and it is gone.
  const gone = await bob.subscribe("c1-fork", 0);
  assert.equal((await gone.next(10_000)).event.seq, 1);
  assert.deepEqual(await admin.deleteConversation("c1-fork"), { deleted: ["c1-fork"] });
  const ended = await refusal(
    (async () => {
      for (;;) await gone.next(10_000);
    })(),
  );
  assert.equal(ended.code, ErrorCode.ConversationNotFound);
  assert.equal((ended.data as { deleted: boolean }).deleted, true);
  assert.equal((await refusal(bob.tail("c1-fork", 0))).code, ErrorCode.ConversationNotFound);

  await assert.rejects(Client.connect(server.url, "oct_not-a-token"), AuthenticationFailed);
  for (const c of [admin, alice, bob]) await c.close();
});

test("a push replica is offered the turn and claims it", async () => {
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const bob = await Client.connect(server.url, server.tokens.bob!);
  const offers = await bob.registerExecutor();
  await admin.createConversation({
    conversationId: "p1",
    scenario: { participants: ["alice", "bob"], policy: { order: "round_robin", first: "bob" } },
  });
  const offer = await offers.next(10_000);
  assert.equal(offer.conversationId, "p1");
  assert.equal(offer.agentId, "bob");
  const granted = await bob.claimTurn(offer.claimId);
  assert.equal(granted.granted, true);
  const r = await bob.sendMessage("p1", "my turn", "turn", { turnHint: granted.turn });
  assert.equal(r.turn, granted.turn);
  assert.equal((await refusal(bob.claimTurn("no-such-claim"))).code, ErrorCode.ClaimNotFound);
  assert.equal(await bob.unregisterExecutor(offers), true);
  await admin.close();
  await bob.close();
});

test("resume and retried writes through a proxy that cuts", async () => {
  // A subscriber and a writer behind a proxy that cuts their connections every 50–150 ms
  // while a direct writer posts: the subscriber sees every event once, in seq order; every
  // write the cut writer made lands once (its retries carry the same idempotency key).
  const admin = await Client.connect(server.url, server.tokens.admin!);
  await admin.createConversation({ conversationId: "busy", participants: ["alice", "bob"] });
  const proxy = await new CuttingProxy(server.port).start();
  const opts = { minBackoffMs: 10, maxBackoffMs: 200 };
  const bob = await Client.connect(proxy.url, server.tokens.bob!, opts);
  const cutAlice = await Client.connect(proxy.url, server.tokens.alice!, opts);
  const direct = await Client.connect(server.url, server.tokens.alice!);
  const sub = await bob.subscribe("busy", 0);

  let cutting = true;
  const cutter = (async () => {
    while (cutting) {
      await sleep(50 + Math.random() * 100);
      proxy.cut();
    }
  })();
  const write = async (client: Client, prefix: string, n: number): Promise<void> => {
    for (let i = 0; i < n; i++) await client.sendMessage("busy", `${prefix}${i}`, "none");
  };
  await Promise.all([write(direct, "d", 150), write(cutAlice, "c", 150)]);
  cutting = false;
  await cutter;
  const total = 1 + 300;
  const seqs: number[] = [];
  while (seqs.length < total) seqs.push((await sub.next(20_000)).event.seq);
  assert.deepEqual(
    seqs,
    Array.from({ length: total }, (_, i) => i + 1),
    "no gap, no duplicate, in order",
  );
  const texts = (await wholeLog(admin, "busy"))
    .filter((e) => e.kind === "message")
    .map((e) => (e.payload as { text: string }).text)
    .sort();
  const expected = [...Array.from({ length: 150 }, (_, i) => `d${i}`), ...Array.from({ length: 150 }, (_, i) => `c${i}`)];
  assert.deepEqual(texts, expected.sort());
  assert.ok(bob.reconnects > 0 && cutAlice.reconnects > 0, "the proxy did cut them");
  for (const c of [admin, bob, cutAlice, direct]) await c.close();
  proxy.close();
});

test("wss:// trusting a custom CA, refused at once without it", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "sdk-ts-tls-"));
  const certs = makeCerts(dir);
  const tls = await Server.start(["--tls-cert", certs.cert, "--tls-key", certs.key]);
  try {
    assert.ok(tls.url.startsWith("wss://"));
    const ca = readFileSync(certs.ca);
    const admin = await Client.connect(tls.url, tls.tokens.admin!, { ca });
    await admin.createConversation({ conversationId: "tls", participants: ["alice"] });
    const alice = await Client.connect(tls.url, tls.tokens.alice!, { ca });
    assert.equal((await alice.sendMessage("tls", "over tls", "none")).seq, 2);
    await admin.close();
    await alice.close();
    // Without the CA the certificate is refused, at once: reconnecting would not help.
    await assert.rejects(Client.connect(tls.url, tls.tokens.alice!), (e: { code?: string }) =>
      String(e.code).includes("CERT"),
    );
    await assert.rejects(Client.connect("not a url", tls.tokens.alice!), SyntaxError);
  } finally {
    tls.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("writes held to a trace sent without waiting land after it, or not at all", async () => {
  // What the executor runs an attempt with: the trace sent without waiting, the agent's writes
  // held to it (its context adds `afterKey`).
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  await admin.createConversation({ conversationId: "h1", participants: ["alice"] });
  // Nothing with that key in the log: refused.
  const refused = await refusal(alice.sendMessage("h1", "too early", "none", { afterKey: "t1.a1.x0" }));
  assert.equal(refused.code, ErrorCode.InvalidParams);
  // The trace, then a write held to it, sent one behind the other without waiting.
  const started = alice.sendTrace("h1", { type: "turn_start" }, { clientRequestId: "t1.a1.x0" });
  const reply = await alice.sendMessage("h1", "held", "none", { afterKey: "t1.a1.x0" });
  assert.equal(reply.seq, (await started).seq + 1);
  await Promise.all([admin.close(), alice.close()]);
});
