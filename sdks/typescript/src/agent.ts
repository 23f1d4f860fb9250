/**
 * The agent model: an `Agent` takes one turn at a time through an `AgentContext`, and says
 * what it did with a `TurnOutcome`. The same model as the Rust SDK's (`agent-sdk`): every write
 * carries the turn as its `turnHint` (a reply can never land in another turn) and an
 * idempotency key made from the turn, the attempt and the order of writes (an attempt run
 * again, after a crash or on another replica, writes nothing twice).
 */

import { performance } from "node:perf_hooks";

import type { Client, Json } from "./client.js";
import { OrchestratorError } from "./errors.js";
import type { AppendResult, Event, Finality, GetUpdatesResult, MessagePayload, Mode, WaitForChangeResult } from "./wire.js";

/** What an agent says it did with its turn. Advisory: what counts is the finality it logged. */
export const TurnOutcome = {
  /** It posted (a reply with finality `turn`, or progress). */
  Posted: "posted",
  /** It hands the turn back without answering. */
  Yield: "yield",
  /** It had nothing to do. */
  NoAction: "no_action",
  /** It closed the conversation (finality `conversation`). */
  Complete: "complete",
} as const;

/** One of `TurnOutcome`'s values. */
export type TurnOutcome = (typeof TurnOutcome)[keyof typeof TurnOutcome];

/**
 * Code that takes one turn at a time. Agents are stateless between turns: they re-read what
 * they need from the log. A rejection from `handleTurn` fails the attempt; the executor traces
 * it and may try again.
 */
export interface Agent {
  /** Takes the turn `ctx` describes. */
  handleTurn(ctx: AgentContext): Promise<TurnOutcome>;
}

/** The attempt's time is up: its context writes no more. */
export class DeadlineExceeded extends OrchestratorError {
  override name = "DeadlineExceeded";
}

/** Everything one attempt at one turn needs. */
export class AgentContext {
  /** The agent taking the turn. */
  readonly agentId: string;
  private writes = 0;
  private readonly abort = new AbortController();
  /** The key of the attempt's `turn_start`, which the executor sent without waiting: this
   * context's other writes are appended only after it (`afterKey`), or refused. */
  private heldTo: string | undefined;

  constructor(
    /** The client the agent speaks through. */
    readonly client: Client,
    /** The conversation. */
    readonly conversationId: string,
    /** The turn (every message is posted with it as `turnHint`). */
    readonly turn: number,
    /** Which attempt this is (1 for the first). */
    readonly attempt: number,
    /** When the turn must be done, on `performance.now()`'s clock (milliseconds). */
    readonly deadline: number,
    /** Where to read context from: the log after this seq. */
    readonly sinceSeq = 0,
    /** What the turn asks for: `converse`, `plan` or `build`. */
    readonly mode: Mode = "converse",
  ) {
    this.agentId = client.agentId ?? "";
  }

  /** Aborted when the attempt ends (its deadline passed): hand it to what the agent awaits. */
  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** @internal Ends the attempt: writes through this context are refused from now on. */
  stop(reason: string): void {
    this.abort.abort(new DeadlineExceeded(reason));
  }

  /** @internal The executor's: this context's writes but the one with `key` are held to it. */
  holdWritesTo(key: string): void {
    this.heldTo = key;
  }

  private afterKey(key: string): string | undefined {
    return key === this.heldTo ? undefined : this.heldTo;
  }

  private nextKey(what: string): string {
    if (this.abort.signal.aborted) throw this.abort.signal.reason;
    return `t${this.turn}.a${this.attempt}.${what}${this.writes++}`;
  }

  /** Milliseconds left before the deadline (0 once it has passed). */
  remaining(): number {
    return Math.max(0, this.deadline - performance.now());
  }

  /** New messages and guidance after `sinceSeq` (the context's cursor when omitted). */
  getUpdates(sinceSeq?: number): Promise<GetUpdatesResult> {
    return this.client.getUpdates(this.conversationId, { sinceSeq: sinceSeq ?? this.sinceSeq });
  }

  /** Every message of the conversation so far. */
  history(): Promise<Event[]> {
    return this.messagesAfter(0);
  }

  /** Every message after seq `after`, page by page. */
  async messagesAfter(after: number): Promise<Event[]> {
    const out: Event[] = [];
    let cursor = after;
    for (;;) {
      const page = await this.getUpdates(cursor);
      const done = page.messages.length === 0 || page.latestSeq <= cursor;
      cursor = page.latestSeq;
      out.push(...page.messages);
      if (done) return out;
    }
  }

  /**
   * Posts a message in this turn: `{seq, turn, duplicate}`. `finality` is `turn` (the reply),
   * `none` (progress) or `conversation` (the last word).
   */
  async post(payload: MessagePayload | string, finality: Finality = "turn"): Promise<AppendResult> {
    const clientRequestId = this.nextKey("m");
    return this.client.sendMessage(this.conversationId, payload, finality, {
      turnHint: this.turn,
      clientRequestId,
      afterKey: this.afterKey(clientRequestId),
    });
  }

  /** Posts text in this turn. */
  say(text: string, finality: Finality = "turn"): Promise<AppendResult> {
    return this.post({ text }, finality);
  }

  /** Writes a trace for this turn. */
  async postTrace(payload: Json | unknown): Promise<AppendResult> {
    const clientRequestId = this.nextKey("x");
    return this.client.sendTrace(this.conversationId, payload, {
      turn: this.turn,
      clientRequestId,
      afterKey: this.afterKey(clientRequestId),
    });
  }

  /** Waits until the conversation moves past `sinceSeq` or `timeoutMs` passes. */
  waitForChange(sinceSeq: number, timeoutMs: number): Promise<WaitForChangeResult> {
    return this.client.waitForChange(this.conversationId, sinceSeq, Math.max(1, Math.round(timeoutMs)));
  }
}
