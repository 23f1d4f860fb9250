/**
 * The agent model against the real server: `ExternalExecutor` in pull and push-claim mode, the
 * executor's traces and retries as the Rust executor core writes them, deadlines, one
 * invocation at a time, high availability (three push replicas in their own processes, one
 * SIGKILLed mid-turn: every turn answered exactly once), and the partner example.
 */

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";
import { after, before, test } from "node:test";

import {
  type Agent,
  type AgentContext,
  Client,
  type Event,
  ExecPolicy,
  ExecutorCore,
  ExternalExecutor,
  TurnOutcome,
} from "../src/index.js";
import { CuttingProxy, ROOT, Server, sleep, until, wholeLog } from "./harness.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(() => server.stop());

const ROUND_ROBIN = { participants: ["alice", "bob"], policy: { order: "round_robin", first: "alice" } };

/** The turn-closing messages of `author`: [turn, text]. */
function replies(log: Event[], author: string): Array<[number, string]> {
  return log
    .filter((e) => e.kind === "message" && e.author === author && e.finality === "turn")
    .map((e) => [e.turn, (e.payload as { text: string }).text]);
}

/** The executor's traces: [type, attempt, outcome or error]. */
function executorTraces(log: Event[]): Array<[string, number, string | null]> {
  return log
    .filter((e) => e.kind === "trace" && String((e.payload as { type?: string }).type ?? "").startsWith("turn_"))
    .map((e) => {
      const p = e.payload as { type: string; attempt: number; outcome?: string; error?: string };
      return [p.type, p.attempt, p.outcome ?? p.error ?? null];
    });
}

/** Alice says `text` in her turn, then waits until bob answered (the turn is hers again). */
async function ask(alice: Client, conversationId: string, text: string, after: number): Promise<number> {
  await alice.sendMessage(conversationId, text);
  for (let i = 0; i < 500; i++) {
    const s = await alice.getConversation(conversationId);
    if (s.guidance.status === "may_speak" && s.turn > after) return s.turn;
    await alice.waitForChange(conversationId, s.latestSeq, 200);
  }
  throw new Error(`bob did not answer ${text}`);
}

class FlakyEcho implements Agent {
  attempts: Array<[number, number]> = [];
  async handleTurn(ctx: AgentContext) {
    this.attempts.push([ctx.turn, ctx.attempt]);
    if (ctx.attempt === 1) throw new Error("first attempts fail");
    const said = (await ctx.history()).filter((m) => m.author === "alice");
    await ctx.say(`echo: ${(said[said.length - 1]!.payload as { text: string }).text}`);
    return TurnOutcome.Posted;
  }
}

test("pull mode takes each turn once, retries and traces as the Rust core", async () => {
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  const bob = await Client.connect(server.url, server.tokens.bob!);
  const agent = new FlakyEcho();
  const executor = new ExternalExecutor(bob, agent);
  const pulling = executor.runPull();
  // Created after the executor started: the all-conversations subscription finds it.
  await admin.createConversation({ conversationId: "pull", scenario: ROUND_ROBIN });
  let turn = 0;
  for (let i = 0; i < 3; i++) turn = await ask(alice, "pull", `q${i}`, turn);
  // The last run's turn_end is written after the turn moved on.
  assert.ok(await until(() => executor.reports.length === 3));
  const log = await wholeLog(admin, "pull");
  assert.deepEqual(
    replies(log, "bob").map(([, t]) => t),
    ["echo: q0", "echo: q1", "echo: q2"],
  );
  const bobTurns = replies(log, "bob").map(([t]) => t);
  assert.deepEqual(
    agent.attempts,
    bobTurns.flatMap((t) => [
      [t, 1],
      [t, 2],
    ]),
  );
  // Per turn, as executors/src/core.rs writes them: start, error, start, end.
  assert.deepEqual(
    executorTraces(log),
    bobTurns.flatMap(() => [
      ["turn_start", 1, null],
      ["turn_error", 1, "first attempts fail"],
      ["turn_start", 2, null],
      ["turn_end", 2, "posted"],
    ]),
  );
  assert.ok(log.filter((e) => e.kind === "trace").every((e) => e.clientRequestId), "every executor write has its key");
  assert.deepEqual(
    executor.reports.map(([, r]) => r.label),
    ["done", "done", "done"],
  );
  await bob.close();
  await pulling; // ends when its client closes
  await admin.close();
  await alice.close();
});

test("push mode claims, runs, and meets deadlines", async () => {
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  const bob = await Client.connect(server.url, server.tokens.bob!);
  const sleeper: Agent = {
    async handleTurn(ctx) {
      await sleep(ctx.remaining() + 500);
      // Past the deadline the context writes no more.
      await assert.rejects(ctx.say("too late"), /deadline exceeded/);
      return TurnOutcome.Posted;
    },
  };
  const sleepy = new ExternalExecutor(bob, sleeper, new ExecutorCore(new ExecPolicy(250, 1)));
  const pushing = sleepy.runPush();
  await admin.createConversation({
    conversationId: "late",
    scenario: { ...ROUND_ROBIN, turn: { timeout: "1s", onTimeout: "skip" } },
  });
  await alice.sendMessage("late", "anyone?");
  let traces: Array<[string, number, string | null]> = [];
  assert.ok(
    await until(async () => {
      traces = executorTraces(await wholeLog(admin, "late"));
      return traces.length === 2;
    }),
  );
  assert.deepEqual(traces, [
    ["turn_start", 1, null],
    ["turn_error", 1, "deadline exceeded"],
  ]);
  // The claim expires with the deadline and the turn may be offered again before its timeout
  // lands: a second claim finds the first run still going (or the deadline gone).
  const labels = new Set(sleepy.reports.map(([, r]) => r.label));
  assert.ok(labels.has("deadline_exceeded"));
  assert.ok([...labels].every((l) => l === "deadline_exceeded" || l === "already_running"));
  await admin.pauseConversation("late"); // its turns would go on timing out and turning over
  await bob.close();
  await pushing;
  assert.equal(
    (await wholeLog(admin, "late")).filter((e) => (e.payload as { text?: string }).text === "too late").length,
    0,
  );

  // Another agent (the conversation above goes on turning over between alice and bob).
  const carol = await Client.connect(server.url, server.token("carol"));
  const quitter = new ExternalExecutor(carol, {
    async handleTurn(ctx) {
      await ctx.say("bye", "conversation");
      return TurnOutcome.Complete;
    },
  });
  const quitting = quitter.runPush();
  await admin.createConversation({
    conversationId: "quit",
    scenario: { participants: ["alice", "carol"], policy: { order: "round_robin", first: "alice" } },
  });
  await alice.sendMessage("quit", "over to you");
  assert.ok(
    await until(async () => quitter.reports.length > 0 && (await admin.getConversation("quit")).status === "closed"),
  );
  const log = await wholeLog(admin, "quit");
  assert.deepEqual(replies(log, "carol"), []);
  assert.deepEqual(
    log.filter((e) => e.finality === "conversation").map((e) => (e.payload as { text: string }).text),
    ["bye"],
  );
  assert.deepEqual(
    quitter.reports.map(([, r]) => [r.label, r.outcome]),
    [["done", "complete"]],
  );
  // A closed conversation takes no more traces: its turn_end is not written.
  assert.deepEqual(executorTraces(log), [["turn_start", 1, null]]);
  await carol.close();
  await quitting;
  await admin.close();
  await alice.close();
});

test("one invocation per conversation and agent", async () => {
  // The same turn handed twice runs once (already_running); a later turn waits for the
  // invocation running to finish.
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  const bob = await Client.connect(server.url, server.tokens.bob!);
  await admin.createConversation({ conversationId: "once", scenario: ROUND_ROBIN });
  await alice.sendMessage("once", "go");
  const s = await bob.getConversation("once");
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const holder: Agent = {
    async handleTurn() {
      await released;
      return TurnOutcome.NoAction;
    },
  };
  const core = new ExecutorCore();
  const a = { conversationId: "once", agentId: "bob", turn: s.turn, deadline: performance.now() + 10_000 };
  const first = core.run(holder, bob, a);
  await sleep(200);
  assert.equal((await core.run(holder, bob, a)).label, "already_running");
  let laterDone = false;
  const later = core.run(holder, bob, { ...a, turn: s.turn + 1 }).finally(() => (laterDone = true));
  await sleep(200);
  assert.equal(laterDone, false, "a later turn waits for the running invocation");
  release();
  assert.equal((await first).label, "done");
  await later;
  for (const c of [admin, alice, bob]) await c.close();
});

test("three push replicas, one killed mid-turn, answer every turn once", async () => {
  const marks = mkdtempSync(path.join(tmpdir(), "sdk-ts-marks-"));
  const replica = path.join(path.dirname(fileURLToPath(import.meta.url)), "replica.js");
  const start = async (name: string): Promise<ChildProcess> => {
    const p = spawn(process.execPath, [replica, server.url, server.tokens.bob!, marks, name], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    const line = await new Promise<string>((resolve) => createInterface({ input: p.stdout! }).once("line", resolve));
    assert.equal(line, "ready");
    return p;
  };
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  await admin.createConversation({ conversationId: "ha", scenario: ROUND_ROBIN });
  // The first replica alone holds bob's first turn; the others join while it works.
  const first = await start("r1");
  await alice.sendMessage("ha", "q0");
  assert.ok(await until(() => readdirSync(marks).some((f) => f.startsWith("r1."))), "the first replica took the turn");
  const others = [await start("r2"), await start("r3")];
  const exited = new Promise((resolve) => first.once("exit", resolve));
  first.kill("SIGKILL"); // mid-turn: it posted progress, not its answer
  await exited;
  let turn = 0;
  assert.ok(
    await until(async () => {
      const s = await alice.getConversation("ha");
      turn = s.turn;
      return s.guidance.status === "may_speak" && s.turn > 1;
    }, 20_000),
    "the turn held by the killed replica was answered",
  );
  for (let i = 1; i < 6; i++) turn = await ask(alice, "ha", `q${i}`, turn);
  const log = await wholeLog(admin, "ha");
  const answered = replies(log, "bob");
  const turns = answered.map(([t]) => t);
  assert.equal(new Set(turns).size, 6, `every turn answered exactly once: ${JSON.stringify(answered)}`);
  assert.equal(turns.length, 6);
  assert.deepEqual(
    answered.map(([, text]) => text),
    turns.map((t) => `answer to turn ${t}`),
  );
  const progress = log.filter((e) => e.author === "bob" && e.finality === "none").map((e) => e.turn);
  assert.equal(new Set(progress).size, progress.length, "no write twice");
  assert.deepEqual([...new Set(progress)].sort(), [...turns].sort());
  const taken = new Set(readdirSync(marks).map((f) => f.split(".")[0]));
  assert.ok(taken.has("r1") && (taken.has("r2") || taken.has("r3")), "the killed replica's turn went to another");
  for (const p of others) p.kill("SIGKILL");
  rmSync(marks, { recursive: true, force: true });
  await admin.close();
  await alice.close();
});

test("the TypeScript partner example answers in both modes", async () => {
  const dir = path.join(ROOT, "examples", "partner-agent", "typescript");
  assert.ok(readFileSync(path.join(dir, "agent.ts"), "utf8").trimEnd().split("\n").length <= 30, "30 lines at most");
  const built = path.join(dir, "dist", "agent.js");
  assert.ok(existsSync(built), `${built} is not built: npm install && npx tsc -p . in ${dir} (scripts/test does)`);
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  for (const mode of ["push", "pull"]) {
    const partner = spawn(process.execPath, [built, mode], {
      env: { ...process.env, ORCHESTRATOR_URL: server.url, ORCHESTRATOR_TOKEN: server.tokens.bob! },
      stdio: "inherit",
    });
    try {
      const conv = `example-${mode}`;
      await admin.createConversation({ conversationId: conv, scenario: ROUND_ROBIN });
      await ask(alice, conv, "hello", 0);
      assert.deepEqual(
        replies(await wholeLog(admin, conv), "bob").map(([, t]) => t),
        ["You said: hello"],
      );
    } finally {
      partner.kill("SIGKILL");
    }
  }
  await admin.close();
  await alice.close();
});

test("a claim lost to another replica through a cut lands one reply", async () => {
  // Replica A, behind a proxy, claims bob's turn and posts progress; the proxy cuts it off (it
  // reconnects, slowly); the turn is offered to replica B, which answers. A then finishes its
  // attempt: its writes are B's (same keys, same bodies) and land nothing twice.
  const gated = (gate?: Promise<void>) => {
    const ran: Array<[string, number]> = [];
    const agent: Agent = {
      async handleTurn(ctx) {
        ran.push([ctx.conversationId, ctx.turn]);
        await ctx.say(`working on turn ${ctx.turn}`, "none");
        if (gate) await gate;
        await ctx.say(`answer to turn ${ctx.turn}`);
        return TurnOutcome.Posted;
      },
    };
    return { agent, ran };
  };
  const admin = await Client.connect(server.url, server.tokens.admin!);
  const alice = await Client.connect(server.url, server.tokens.alice!);
  const proxy = await new CuttingProxy(server.port).start();
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const aClient = await Client.connect(proxy.url, server.tokens.bob!, { minBackoffMs: 1000, maxBackoffMs: 1000 });
  const a = new ExternalExecutor(aClient, gated(gate).agent);
  const aRun = a.runPush();
  await admin.createConversation({ conversationId: "lost", scenario: ROUND_ROBIN });
  await alice.sendMessage("lost", "q0");
  assert.ok(
    await until(async () => (await wholeLog(admin, "lost")).some((e) => e.finality === "none")),
    "replica A started the turn",
  );
  const bClient = await Client.connect(server.url, server.tokens.bob!);
  const bAgent = gated();
  const b = new ExternalExecutor(bClient, bAgent.agent);
  const bRun = b.runPush();
  proxy.cut(); // A loses its connection holding the claim
  assert.ok(await until(async () => replies(await wholeLog(admin, "lost"), "bob").length > 0));
  // (The server's other conversations may give bob turns too: "late" turns over forever.)
  assert.deepEqual(
    bAgent.ran.filter(([c]) => c === "lost"),
    [["lost", 2]],
    "replica B took the turn A lost",
  );
  open(); // A's attempt goes on, after its reconnect
  assert.ok(await until(() => a.reports.some(([x]) => x.conversationId === "lost" && x.turn === 2)));
  assert.ok(aClient.reconnects > 0);
  const log = await wholeLog(admin, "lost");
  assert.deepEqual(replies(log, "bob"), [[2, "answer to turn 2"]], "one reply");
  assert.deepEqual(
    log.filter((e) => e.finality === "none").map((e) => (e.payload as { text: string }).text),
    ["working on turn 2"],
  );
  for (const c of [aClient, bClient, admin, alice]) await c.close();
  await Promise.all([aRun, bRun]);
  proxy.close();
});
