/**
 * Executors: how a turn is run (`ExecutorCore`), and `ExternalExecutor`, which takes an agent's
 * turns in a partner's process in pull or push-claim mode. Behaves as the Rust executor core
 * (`executors/src/core.rs`) does:
 *
 * - one invocation per (conversation, agent) at a time: a second call for the turn running
 *   returns `already_running`; a call for a later turn waits for the running one to finish;
 * - each attempt is traced (`turn_start`, then `turn_end` or `turn_error`), each trace under the
 *   key `t{turn}.a{attempt}.{start|end|err}` so a repeated run writes it once; the agent runs
 *   without waiting for `turn_start`, its writes held to it (`afterKey`), once the turn is known
 *   to be still its own (a push claim just granted, or the server's view);
 * - an attempt that fails is retried after `backoffMs`, doubled for each retry, while the retry
 *   would start before the deadline and attempts remain; before a retry the turn must still be
 *   the agent's;
 * - an attempt that posted only progress waits `graceMs` for the turn to close, and is run
 *   again (`turn_end` with outcome `incomplete`) when it did not;
 * - at the deadline the attempt is given up (its context's `signal` aborts and its writes are
 *   refused) and traced as `deadline exceeded`.
 */

import { performance } from "node:perf_hooks";

import { type Agent, AgentContext, TurnOutcome } from "./agent.js";
import type { Client, Json } from "./client.js";
import { ErrorCode, RpcError } from "./errors.js";
import type { Mode, RequestTurnNotification, Snapshot } from "./wire.js";

/** Refusals that mean the turn is no longer the agent's to take. */
const GONE = new Set<number>([
  ErrorCode.TurnClosed,
  ErrorCode.TurnMismatch,
  ErrorCode.ConversationClosed,
  ErrorCode.NotYourTurn,
  ErrorCode.ConversationPaused,
  ErrorCode.Forbidden,
  ErrorCode.ConversationNotFound,
]);

function gone(e: unknown): boolean {
  return e instanceof RpcError && GONE.has(e.code);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** How the core runs a turn (milliseconds). */
export class ExecPolicy {
  constructor(
    /** How long to wait for the turn to close after the agent posted only progress. */
    readonly graceMs = 250,
    /** Attempts at most (the first included). */
    readonly maxAttempts = 3,
    /** The first retry's delay; it doubles with each retry. */
    readonly backoffMs = 50,
  ) {}

  /**
   * The wait before the attempt after failed attempt `attempt` (1 for the first), or null when
   * the retry would start at or past `deadline`.
   */
  retryAfter(attempt: number, now: number, deadline: number): number | null {
    const delay = this.backoffMs * 2 ** Math.max(0, attempt - 1);
    return now + delay < deadline ? delay : null;
  }
}

/** A turn handed to an executor. */
export interface Assignment {
  conversationId: string;
  agentId: string;
  turn: number;
  /** When the turn must be done, on `performance.now()`'s clock. */
  deadline: number;
  /** Context starts after this seq. */
  sinceSeq?: number;
  mode?: Mode;
  /** Write `turn_start` and `turn_end` traces (failures are always traced); true by default. */
  traces?: boolean;
  /**
   * The server granted this turn to this executor a moment ago (a push claim's answer, given
   * only while the turn is the agent's): the first attempt does not ask again.
   */
  granted?: boolean;
}

/**
 * How a run ended: `done` (with the agent's `outcome`), `already_running`, `not_mine` (the turn
 * was answered elsewhere, closed or paused), `deadline_exceeded` or `failed` (every attempt
 * failed; `error` is the last one).
 */
export interface RunReport {
  label: "done" | "already_running" | "not_mine" | "deadline_exceeded" | "failed";
  outcome?: TurnOutcome;
  error?: string;
}

/** Whether `turn` of the conversation is still the client's agent's to take. */
export async function stillMine(client: Client, conversationId: string, turn: number): Promise<boolean> {
  try {
    const s = await client.getConversation(conversationId);
    return s.turn === turn && s.guidance.status === "may_speak";
  } catch {
    return false;
  }
}

class Slot {
  turn = 0;
  users = 0;
  private tail: Promise<void> = Promise.resolve();

  /** Waits for the invocations before this one; the returned function lets the next go. */
  lock(): { acquired: Promise<void>; release: () => void } {
    let release!: () => void;
    const mine = new Promise<void>((resolve) => (release = resolve));
    const acquired = this.tail;
    this.tail = this.tail.then(() => mine);
    return { acquired, release };
  }
}

const TIMED_OUT = Symbol("timed out");

function within<T>(work: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<typeof TIMED_OUT>((resolve) => {
    timer = setTimeout(() => resolve(TIMED_OUT), Math.max(0, ms));
  });
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}

function message(e: unknown): string {
  return e instanceof Error ? e.message || e.name : String(e);
}

/** Runs one turn, whoever triggered it. Share one among the executors of a process. */
export class ExecutorCore {
  private slots = new Map<string, Slot>();

  constructor(readonly policy = new ExecPolicy()) {}

  /** Runs `agent` for the assignment through `client`. */
  async run(agent: Agent, client: Client, a: Assignment): Promise<RunReport> {
    const key = JSON.stringify([a.conversationId, a.agentId]);
    let slot = this.slots.get(key);
    if (!slot) {
      slot = new Slot();
      this.slots.set(key, slot);
    }
    if (slot.turn === a.turn) return { label: "already_running" };
    slot.users += 1;
    const { acquired, release } = slot.lock();
    try {
      if ((await within(acquired, a.deadline - performance.now())) === TIMED_OUT) {
        return { label: "deadline_exceeded" };
      }
      slot.turn = a.turn;
      try {
        return await this.attempts(agent, client, a);
      } finally {
        slot.turn = 0;
      }
    } finally {
      release();
      slot.users -= 1;
      if (slot.users === 0) this.slots.delete(key);
    }
  }

  private async attempts(agent: Agent, client: Client, a: Assignment): Promise<RunReport> {
    const traces = a.traces ?? true;
    let lastError = "";
    for (let attempt = 1; attempt <= Math.max(1, this.policy.maxAttempts); attempt++) {
      // The first attempt comes straight from an assignment, a claim or fresh guidance; its
      // start trace (which names the turn) fails if the turn has moved on since.
      if (attempt > 1 && !(await stillMine(client, a.conversationId, a.turn))) {
        return { label: "failed", error: lastError };
      }
      // Before the agent runs, the turn must still be its own: a claim just granted says so;
      // otherwise the server's view is asked.
      if (attempt === 1 && !a.granted && !(await stillMine(client, a.conversationId, a.turn))) {
        return { label: "not_mine" };
      }
      // The attempt's `turn_start` (its context's first write, key `…x0`) is sent and the agent
      // runs at once, its writes held to the trace (`afterKey`): they land after it, or are
      // refused when it did not land.
      const ctx = new AgentContext(client, a.conversationId, a.turn, attempt, a.deadline, a.sinceSeq ?? 0, a.mode);
      if (traces) ctx.holdWritesTo(`t${a.turn}.a${attempt}.x0`);
      const started: Promise<unknown> | null = traces
        ? ctx.postTrace(trace("turn_start", a, attempt)).then(
            () => null,
            (e: unknown) => e ?? new Error("turn_start failed"),
          )
        : null;
      let outcome: TurnOutcome | typeof TIMED_OUT;
      try {
        outcome = await within(Promise.resolve().then(() => agent.handleTurn(ctx)), a.deadline - performance.now());
      } catch (e) {
        const failed = started && (await started);
        if (failed) {
          if (gone(failed)) return { label: "not_mine" };
          lastError = message(failed);
          continue;
        }
        lastError = message(e);
        client.logger.warn(`turn ${a.turn} of ${a.conversationId}: attempt ${attempt} failed: ${lastError}`);
        await this.traceError(client, a, attempt, lastError);
        const delay = this.policy.retryAfter(attempt, performance.now(), a.deadline);
        if (delay === null) return { label: "failed", error: lastError };
        await sleep(delay);
        continue;
      }
      const failed = started && (await started);
      if (failed) {
        // Nothing the attempt wrote landed.
        ctx.stop("turn_start failed");
        if (gone(failed)) return { label: "not_mine" };
        lastError = message(failed);
        continue;
      }
      if (outcome === TIMED_OUT) {
        ctx.stop("deadline exceeded");
        await this.traceError(client, a, attempt, "deadline exceeded");
        return { label: "deadline_exceeded" };
      }
      if (outcome === TurnOutcome.Posted && !(await this.closedWithinGrace(client, a))) {
        // Progress only: the turn is still open. Try again while there is time.
        lastError = "the agent posted progress but did not close its turn";
        if (traces) await this.trace(client, a, "end", { ...trace("turn_end", a, attempt), outcome: "incomplete" });
        continue;
      }
      if (traces) await this.trace(client, a, "end", { ...trace("turn_end", a, attempt), outcome });
      return { label: "done", outcome };
    }
    return { label: "failed", error: lastError };
  }

  private async traceError(client: Client, a: Assignment, attempt: number, error: string): Promise<void> {
    await this.trace(client, a, "err", { ...trace("turn_error", a, attempt), error });
  }

  private async closedWithinGrace(client: Client, a: Assignment): Promise<boolean> {
    const until = Math.min(performance.now() + this.policy.graceMs, a.deadline);
    for (;;) {
      let s: Snapshot;
      try {
        s = await client.getConversation(a.conversationId);
      } catch {
        return true;
      }
      if (s.turn !== a.turn || s.guidance.status !== "may_speak") return true;
      const left = until - performance.now();
      if (left <= 0) return false;
      try {
        await client.waitForChange(a.conversationId, s.latestSeq, Math.max(1, Math.round(left)));
      } catch {
        return true;
      }
    }
  }

  /**
   * Writes an executor trace. Once the agent closed its turn the trace lands in the current
   * turn (a closed turn takes no traces); its payload names the turn it reports on. Its key
   * makes it appear once even if the run is repeated.
   */
  private async trace(client: Client, a: Assignment, what: string, payload: Json): Promise<void> {
    const clientRequestId = `t${a.turn}.a${String(payload.attempt)}.${what}`;
    try {
      await client.sendTrace(a.conversationId, payload, { turn: a.turn, clientRequestId });
    } catch (e) {
      if (e instanceof RpcError && e.code === ErrorCode.TurnClosed) {
        await client.sendTrace(a.conversationId, payload, { clientRequestId }).catch(() => {});
      }
    }
  }
}

function trace(type: string, a: Assignment, attempt: number): Json {
  return { type, agent: a.agentId, turn: a.turn, attempt };
}

/** A wall-clock deadline from the server as a time on `performance.now()`'s clock. */
function deadlineFrom(rfc3339: string | null | undefined, defaultMs: number): number {
  const at = rfc3339 ? Date.parse(rfc3339) : NaN;
  if (Number.isNaN(at)) return performance.now() + defaultMs;
  return performance.now() + Math.max(0, at - Date.now());
}

/** Runs an agent as the client's identity, taking turns as they come. */
export class ExternalExecutor {
  /** How each run ended, in order (for logs and tests). */
  readonly reports: Array<[Assignment, RunReport]> = [];
  private running = new Set<Promise<void>>();

  constructor(
    readonly client: Client,
    readonly agent: Agent,
    readonly core = new ExecutorCore(),
    /** The deadline (ms) used when the server names none (pull mode without a turn timeout). */
    readonly defaultTimeoutMs = 60_000,
  ) {}

  /**
   * Push-claim mode: registers for `request_turn` offers, claims each one, and runs the agent
   * on every claim granted. The reply carries the claimed turn as `turnHint`, so a replica that
   * lost its claim cannot post a second reply. Resolves when the client is closed.
   */
  async runPush(): Promise<void> {
    const offers = await this.client.registerExecutor();
    for await (const offer of offers) this.spawn(this.claimAndRun(offer));
    await Promise.allSettled(this.running);
  }

  private async claimAndRun(offer: RequestTurnNotification): Promise<void> {
    let claim;
    try {
      claim = await this.client.claimTurn(offer.claimId);
    } catch {
      return; // another replica has it, or the turn is over
    }
    if (!claim.granted) return;
    await this.runOne({
      conversationId: claim.conversationId,
      agentId: offer.agentId,
      turn: claim.turn,
      deadline: deadlineFrom(claim.deadline, offer.deadlineMs),
      sinceSeq: offer.sinceSeq,
      mode: offer.mode ?? "converse",
      granted: true,
    });
  }

  /**
   * Pull mode: follows every conversation the agent takes part in (new ones included) and runs
   * the agent on each turn its guidance gives it. Each turn is taken at most once by this
   * executor; after a reconnect the subscription replays what it missed, so no turn is missed.
   * Resolves when the client is closed.
   */
  async runPull(): Promise<void> {
    const sub = await this.client.subscribe();
    const handled = new Map<string, number>();
    const mine = this.client.agentId === null ? {} : { participant: this.client.agentId };
    for (const s of await this.client.allConversations({ status: "open", ...mine })) this.consider(s, handled);
    for await (const item of sub) {
      const e = item.event;
      if (e.kind === "trace" || (e.kind === "message" && e.finality === "none")) continue;
      try {
        this.consider(await this.client.getConversation(item.conversationId), handled);
      } catch {
        // guidance not read; the next event tries again
      }
    }
    await Promise.allSettled(this.running);
  }

  /** Runs the agent if this snapshot says the turn is its own and it was not taken yet. */
  private consider(s: Snapshot, handled: Map<string, number>): void {
    const g = s.guidance;
    if (g.status !== "may_speak" || s.speaker !== this.client.agentId) return;
    if ((handled.get(s.conversationId) ?? 0) >= s.turn) return;
    handled.set(s.conversationId, s.turn);
    this.spawn(
      this.runOne({
        conversationId: s.conversationId,
        agentId: this.client.agentId ?? "",
        turn: s.turn,
        deadline: deadlineFrom(g.deadline, this.defaultTimeoutMs),
        mode: g.mode ?? "converse",
      }),
    );
  }

  private async runOne(a: Assignment): Promise<void> {
    const log = this.client.logger;
    log.info(`took turn ${a.turn} of ${a.conversationId}`);
    const report = await this.core.run(this.agent, this.client, a);
    this.reports.push([a, report]);
    const what = `turn ${a.turn} of ${a.conversationId}`;
    if (report.label === "done") log.info(`${what} done: ${report.outcome ?? ""}`);
    else if (report.label === "failed" || report.label === "deadline_exceeded") {
      log.warn(`${what} ${report.label.replace("_", " ")}: ${report.error ?? ""}`);
    } else log.info(`${what} not run: ${report.label.replace("_", " ")}`);
  }

  private spawn(work: Promise<void>): void {
    const p = work.catch(() => {}).finally(() => this.running.delete(p));
    this.running.add(p);
  }
}
