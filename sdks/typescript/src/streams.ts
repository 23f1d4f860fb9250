/**
 * What a `Client` delivers as it comes: the events of a subscription and the turn offers of a
 * push executor's registration, each an async iterable with a bounded wait for its next item.
 */

import type { Json } from "./client.js";
import { ConnectionClosed, RpcError } from "./errors.js";
import type { EventNotification, RequestTurnNotification } from "./wire.js";

const END = Symbol("end");

/** Items in order, until an end: what subscriptions and registrations hand out. */
class Stream<T> implements AsyncIterable<T> {
  private items: Array<T | typeof END> = [];
  private waiters: Array<(item: T | typeof END) => void> = [];
  /** True once the stream has ended (what it held may still be taken). */
  closed = false;
  /** The error the server ended it with (its conversation was deleted, say), if any. */
  error: Error | null = null;

  push(item: T): void {
    const w = this.waiters.shift();
    if (w) w(item);
    else this.items.push(item);
  }

  /** Ends it with `error`: thrown once what it held was taken. */
  fail(error: Error): void {
    if (this.closed) return;
    this.error = error;
    this.end();
  }

  end(): void {
    if (this.closed) return;
    this.closed = true;
    for (const w of this.waiters.splice(0)) w(END);
    this.items.push(END);
  }

  private pull(timeoutMs?: number): Promise<T | typeof END> {
    const first = this.items[0];
    if (first !== undefined) {
      if (first !== END) this.items.shift();
      return Promise.resolve(first);
    }
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const waiter = (item: T | typeof END): void => {
        if (timer) clearTimeout(timer);
        resolve(item);
      };
      this.waiters.push(waiter);
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          this.waiters = this.waiters.filter((w) => w !== waiter);
          reject(new Error(`nothing came within ${timeoutMs} ms`));
        }, timeoutMs);
      }
    });
  }

  /** The next item, waiting at most `timeoutMs`; `ConnectionClosed` once ended and drained. */
  async next(timeoutMs?: number): Promise<T> {
    const item = await this.pull(timeoutMs);
    if (item === END) throw this.error ?? new ConnectionClosed("the stream has ended");
    return item;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const item = await this.pull();
      if (item === END) {
        if (this.error) throw this.error;
        return;
      }
      yield item;
    }
  }
}

/**
 * Events of one conversation, or of every conversation the caller takes part in, in seq order
 * per conversation with no gap and no duplicate across reconnects. Iterate it (`for await`):
 * each item is `{conversationId, event}`.
 */
export class Subscription extends Stream<EventNotification> {
  /** The server's id for it on the current connection. */
  serverId: number | null = null;
  constructor(
    /** The conversation, or null for every conversation. */
    readonly conversationId: string | null,
    /** The last seq delivered (or to resume after), per conversation. */
    readonly cursors: Map<string, number>,
    /** For every conversation: where a conversation with no cursor replays from. */
    readonly sinceAll = 0,
  ) {
    super();
  }

  /** @internal */
  deliver(n: EventNotification): void {
    const seq = n.event.seq;
    if (seq <= (this.cursors.get(n.conversationId) ?? 0)) return; // delivered before a reconnect
    this.cursors.set(n.conversationId, seq);
    this.push(n);
  }

  /** @internal `subscribe`'s params from the cursors: what it has not delivered yet. */
  params(): Json {
    if (this.conversationId !== null) {
      return { conversationId: this.conversationId, sinceSeq: this.cursors.get(this.conversationId) ?? 0 };
    }
    return { sinceSeq: this.sinceAll, cursors: Object.fromEntries(this.cursors) };
  }
}

/**
 * The `request_turn` offers made to this connection as a push replica of its agent
 * (`Client.registerExecutor`); claim one with `Client.claimTurn`.
 */
export class Offers extends Stream<RequestTurnNotification> {
  /** The server's id for the registration on the current connection. */
  serverId: number | null = null;
}

/** @internal A notification's params: its subscription, and its result or the error that ends it. */
export interface Notification {
  subscription: number;
  result?: unknown;
  error?: Json;
}

/**
 * @internal Hands a notification to its subscription or registration; answers the
 * subscriptions still held (one the server ended with an error, its conversation deleted say,
 * is not subscribed again).
 */
export function route(
  method: unknown,
  params: Notification | undefined,
  subs: Subscription[],
  offers: Offers[],
): Subscription[] {
  if (!params) return subs;
  if (method === "event") {
    for (const sub of subs) {
      if (sub.serverId !== params.subscription) continue;
      if (params.error) {
        sub.fail(RpcError.fromWire(params.error));
        return subs.filter((s) => s !== sub);
      }
      sub.deliver(params.result as EventNotification);
    }
  } else if (method === "request_turn") {
    for (const o of offers) {
      if (o.serverId === params.subscription) o.push(params.result as RequestTurnNotification);
    }
  }
  return subs;
}
