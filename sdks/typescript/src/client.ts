/**
 * `Client`: every method of the orchestrator's protocol over one WebSocket, kept alive.
 *
 * One loop owns the connection. When it drops, that loop reconnects with exponential backoff
 * and jitter, authenticates again, subscribes again from the cursor of each subscription (the
 * last seq it delivered, per conversation) and registers its push executors again, then sends
 * again every call that had no answer yet. A write sent again is safe: `sendMessage` and
 * `sendTrace` always carry an idempotency key (one is made when the caller gives none), so the
 * server answers a write it already took with the original result (`duplicate: true`), and a
 * subscription skips what it delivered before the drop. Callers see none of it but the wait.
 */

import { randomUUID } from "node:crypto";
import WebSocket from "ws";

import { AuthenticationFailed, ConnectionClosed, ErrorCode, RpcError } from "./errors.js";
import { type Notification, Offers, route, Subscription } from "./streams.js";
import type {
  AppendResult,
  ClaimTurnResult,
  CreateConversationParams,
  CreateConversationResult,
  CreateTokenParams,
  CreateTokenResult,
  DeleteConversationResult,
  Finality,
  GetUpdatesResult,
  ListConversationsParams,
  ListConversationsResult,
  ListScenariosResult,
  ListTenantsResult,
  ListTokensParams,
  ListTokensResult,
  MessagePayload,
  RevokeTokenParams,
  RevokeTokenResult,
  Snapshot,
  TailResult,
  TenantQuotas,
  TenantSummary,
  WaitForChangeResult,
} from "./wire.js";

export { Offers, Subscription };

/** A JSON object as the protocol sends it. */
export type Json = Record<string, unknown>;

/** How a client connects. */
export interface ClientOptions {
  /** The first reconnect's delay in milliseconds (doubling, with jitter); 50 by default. */
  minBackoffMs?: number;
  /** The longest delay between reconnects in milliseconds; 5,000 by default. */
  maxBackoffMs?: number;
  /** Certificate authorities to trust for `wss://` (PEM), beside the system's. */
  ca?: string | Buffer | Array<string | Buffer>;
  /**
   * How long `connect` tries to make the first connection before it gives up (a wrong URL, a
   * server that is not there), in milliseconds; 10,000 by default. Once connected, the client
   * reconnects for good.
   */
  connectTimeoutMs?: number;
  /** Where the client and its executors say what they do (connections, turns, errors); silent by default. */
  logger?: Logger;
}

/** What the SDK logs through: `console` fits, or any logger with these three methods. */
export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
}

const SILENT: Logger = { debug() {}, info() {}, warn() {} };

interface Call {
  method: string;
  params: Json;
  resolve: (value: unknown) => void;
  reject: (error: unknown) => void;
  /** Run as the answer is read, before the reader reads on. */
  onResult?: (result: unknown) => void;
}

function some(params: Json): Json {
  return Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined && v !== null));
}

/** Node's codes for a certificate that does not verify. */
const CERTIFICATE_ERRORS = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "ERR_TLS_CERT_ALTNAME_INVALID",
]);

function isCertificateError(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === "string" && CERTIFICATE_ERRORS.has(code);
}

/** A new idempotency key. */
export function newKey(): string {
  return `ts-${randomUUID()}`;
}

/**
 * A connection to the orchestrator as the agent of a token. Make one with
 * `await Client.connect(url, token)`; close it with `await client.close()`.
 */
export class Client {
  /** The agent the token speaks as, once authenticated. */
  agentId: string | null = null;
  /** How many times the connection was made again after a drop. */
  reconnects = 0;

  private nextId = 1;
  private calls = new Map<number, Call>();
  private subs: Subscription[] = [];
  private offers: Offers[] = [];
  private ws: WebSocket | null = null;
  private ready = false;
  private closing = false;
  private fatal: Error | null = null;
  private owner: Promise<void> | null = null;
  private readyWaiters: Array<(error: Error | null) => void> = [];
  private wake: (() => void) | null = null;
  private lastError = "";

  private constructor(
    readonly url: string,
    private readonly token: string,
    private readonly options: ClientOptions,
  ) {}

  /**
   * Connects and authenticates (rejecting with `AuthenticationFailed` for a refused token);
   * from then on the client keeps itself connected.
   */
  static async connect(url: string, token: string, options: ClientOptions = {}): Promise<Client> {
    const client = new Client(url, token, options);
    const limit = options.connectTimeoutMs ?? 10_000;
    let timer: NodeJS.Timeout | undefined;
    const ready = new Promise<void>((resolve, reject) => {
      client.readyWaiters.push((e) => (e ? reject(e) : resolve()));
      timer = setTimeout(() => {
        const why = client.lastError || "no answer";
        reject(new ConnectionClosed(
          `could not connect to ${url} within ${limit / 1000} s (${why}): is the server running there? (ORCHESTRATOR_URL)`,
        ));
      }, limit);
    });
    client.owner = client.own();
    try {
      await ready;
    } catch (e) {
      await client.close();
      throw e;
    } finally {
      clearTimeout(timer);
    }
    return client;
  }

  /** Where this client and its executors log. */
  get logger(): Logger {
    return this.options.logger ?? SILENT;
  }

  /** Closes the connection for good: calls still waiting reject with `ConnectionClosed`. */
  async close(): Promise<void> {
    this.closing = true;
    this.ws?.close();
    this.wake?.();
    this.failAll(new ConnectionClosed("the client was closed"));
    await this.owner;
  }

  // -- the protocol's methods -------------------------------------------------------------

  /** `createConversation` (`conversationId`, `participants`, `metadata`, `scenario`, …). */
  createConversation(params: CreateConversationParams | Json = {}): Promise<CreateConversationResult> {
    return this.call("createConversation", params as Json);
  }

  /** `getConversation`: the snapshot with the caller's guidance. */
  getConversation(conversationId: string): Promise<Snapshot> {
    return this.call("getConversation", { conversationId });
  }

  /** `listConversations`: a page, newest activity first: `{conversations, nextCursor?}` (filters as the protocol names them). */
  listConversations(params: ListConversationsParams = {}): Promise<ListConversationsResult> {
    return this.call("listConversations", some({ ...params }));
  }

  /** Every conversation `listConversations` answers for `params`, page after page (at most `maxPages`). */
  async allConversations(params: ListConversationsParams = {}, maxPages = 1000): Promise<Snapshot[]> {
    const found: Snapshot[] = [];
    let p: ListConversationsParams = { limit: 1000, ...params };
    for (let i = 0; i < maxPages; i++) {
      const page = await this.listConversations(p);
      found.push(...page.conversations);
      if (page.nextCursor === undefined) break;
      p = { ...p, cursor: page.nextCursor };
    }
    return found;
  }

  /** `listScenarios` (admins): the server's scenario library. */
  listScenarios(): Promise<ListScenariosResult> {
    return this.call("listScenarios", {});
  }

  /** `createToken` (the tenant's admins): `{token, id, tenant, agentId, admin, expiresMs?}`, the token shown this once. */
  createToken(params: CreateTokenParams): Promise<CreateTokenResult> {
    return this.call("createToken", some({ ...params }));
  }

  /** `listTokens` (the tenant's admins; an operator names any `tenant`): `{tokens}`, never the tokens themselves. */
  listTokens(params: ListTokensParams = {}): Promise<ListTokensResult> {
    return this.call("listTokens", some({ ...params }));
  }

  /** `createTenant` (operators). */
  createTenant(name: string): Promise<TenantSummary> {
    return this.call("createTenant", { name });
  }

  /** `listTenants` (operators): `{tenants}`, each with its quotas. */
  listTenants(): Promise<ListTenantsResult> {
    return this.call("listTenants", {});
  }

  /** `setTenantQuotas` (operators): replaces the tenant's quotas (an absent one is the server's default). */
  setTenantQuotas(tenant: string, quotas: TenantQuotas): Promise<TenantSummary> {
    return this.call("setTenantQuotas", { tenant, quotas });
  }

  /** `revokeToken` (the tenant's admins): by the token's `id`, or every token of an `agentId`. */
  revokeToken(params: RevokeTokenParams): Promise<RevokeTokenResult> {
    return this.call("revokeToken", some({ ...params }));
  }

  /** `tail`: `{events, latestSeq}` after `sinceSeq` (at most `limit`, capped at 1,000). */
  tail(conversationId: string, sinceSeq = 0, limit?: number): Promise<TailResult> {
    return this.call("tail", some({ conversationId, sinceSeq, limit }));
  }

  /** `waitForChange`: `{latestSeq, timedOut}` once the log is past `sinceSeq`. */
  waitForChange(conversationId: string, sinceSeq: number, timeoutMs: number): Promise<WaitForChangeResult> {
    return this.call("waitForChange", { conversationId, sinceSeq, timeoutMs });
  }

  /** `getUpdatesOrGuidance`: the messages after `sinceSeq` with guidance. */
  getUpdates(
    conversationId: string,
    options: { sinceSeq?: number; limit?: number; timeoutMs?: number } = {},
  ): Promise<GetUpdatesResult> {
    return this.call("getUpdatesOrGuidance", some({ conversationId, ...options }));
  }

  /**
   * `sendMessage` (`payload`: a message payload, or its text): `{seq, turn, duplicate}`. It
   * always carries an idempotency key (a new one when none is given), so a retry after a lost
   * answer appends nothing twice.
   */
  sendMessage(
    conversationId: string,
    payload: MessagePayload | string,
    finality: Finality = "turn",
    options: { turnHint?: number; clientRequestId?: string; afterKey?: string } = {},
  ): Promise<AppendResult> {
    const params: Json = {
      conversationId,
      payload: typeof payload === "string" ? { text: payload } : payload,
      finality,
      clientRequestId: options.clientRequestId ?? newKey(),
    };
    if (options.turnHint !== undefined) params.turnHint = { turn: options.turnHint };
    if (options.afterKey !== undefined) params.afterKey = options.afterKey;
    return this.call("sendMessage", params);
  }

  /**
   * `sendTrace`: `{seq, turn, duplicate}`, with an idempotency key as `sendMessage`. Its frame
   * is sent when this is called (or, while reconnecting, with the calls parked before and
   * after it, in order): a write made after it reaches the server after it.
   */
  sendTrace(
    conversationId: string,
    payload: unknown,
    options: { turn?: number; clientRequestId?: string; afterKey?: string } = {},
  ): Promise<AppendResult> {
    return this.call(
      "sendTrace",
      some({
        conversationId,
        payload,
        turn: options.turn,
        clientRequestId: options.clientRequestId ?? newKey(),
        afterKey: options.afterKey,
      }),
    );
  }

  /** `deleteConversation` (its tenant's admins, or its creator): it and its sub-conversations. */
  deleteConversation(conversationId: string): Promise<DeleteConversationResult> {
    return this.call("deleteConversation", { conversationId }) as Promise<DeleteConversationResult>;
  }

  /** `pauseConversation` (admins). */
  pauseConversation(conversationId: string): Promise<unknown> {
    return this.call("pauseConversation", { conversationId });
  }

  /** `resumeConversation` (admins). */
  resumeConversation(conversationId: string): Promise<unknown> {
    return this.call("resumeConversation", { conversationId });
  }

  /** `forkConversation` (admins): `{conversationId}` of the copy. */
  forkConversation(conversationId: string, atSeq: number, newConversationId?: string): Promise<CreateConversationResult> {
    return this.call("forkConversation", some({ conversationId, atSeq, newConversationId }));
  }

  /**
   * `subscribe`: the events after `sinceSeq` of one conversation, or of every conversation the
   * caller takes part in (with `sinceSeq`, each replays after it; without, only what commits
   * from now on). Kept across reconnects from its cursors.
   */
  async subscribe(conversationId?: string, sinceSeq?: number): Promise<Subscription> {
    let sub: Subscription;
    if (conversationId !== undefined) {
      // "From now on", made exact: the head now is the cursor to resume from.
      const from = sinceSeq ?? (await this.getConversation(conversationId)).latestSeq;
      sub = new Subscription(conversationId, new Map([[conversationId, from]]));
    } else if (sinceSeq === undefined) {
      // The same for every conversation; those created later replay from their start.
      const listed = await this.allConversations(this.agentId === null ? {} : { participant: this.agentId });
      sub = new Subscription(null, new Map(listed.map((c) => [c.conversationId, c.latestSeq])));
    } else {
      sub = new Subscription(null, new Map(), sinceSeq);
    }
    this.subs.push(sub);
    await this.call("subscribe", sub.params(), (id) => {
      sub.serverId = id as number;
    });
    return sub;
  }

  /** `unsubscribe`: ends `sub` (its iteration stops after what it holds). */
  async unsubscribe(sub: Subscription): Promise<boolean> {
    sub.end();
    this.subs = this.subs.filter((s) => s !== sub);
    if (sub.serverId === null) return false;
    return Boolean(await this.call("unsubscribe", { subscription: sub.serverId }));
  }

  /**
   * `registerExecutor {mode: "push"}`: this connection becomes a push replica of its agent;
   * the turns offered to it come through the returned `Offers`.
   */
  async registerExecutor(): Promise<Offers> {
    const offers = new Offers();
    this.offers.push(offers);
    await this.call("registerExecutor", { mode: "push" }, (id) => {
      offers.serverId = id as number;
    });
    return offers;
  }

  /** `unregisterExecutor`: no more offers come to `offers`. */
  async unregisterExecutor(offers: Offers): Promise<boolean> {
    offers.end();
    this.offers = this.offers.filter((o) => o !== offers);
    if (offers.serverId === null) return false;
    return Boolean(await this.call("unregisterExecutor", { subscription: offers.serverId }));
  }

  /**
   * `claimTurn`: `{granted, conversationId, turn, deadline}`, or `RpcError` with
   * `ErrorCode.ClaimNotFound` when another replica has it or the turn is over.
   */
  claimTurn(claimId: string): Promise<ClaimTurnResult> {
    return this.call("claimTurn", { claimId });
  }

  /**
   * Any method by name: its result, or `RpcError`. Sent again after a reconnect until it is
   * answered or the client is closed.
   */
  call<T>(method: string, params: Json, onResult?: (result: unknown) => void): Promise<T> {
    if (this.closing) return Promise.reject(new ConnectionClosed("the client was closed"));
    if (this.fatal) return Promise.reject(this.fatal);
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const call: Call = {
        method,
        params,
        resolve: (v) => {
          this.calls.delete(id);
          resolve(v as T);
        },
        reject: (e) => {
          this.calls.delete(id);
          reject(e);
        },
        onResult,
      };
      this.calls.set(id, call);
      this.send(id, call);
    });
  }

  // -- the connection ---------------------------------------------------------------------

  private send(id: number, call: Call): void {
    const ws = this.ws;
    if (!ws || !this.ready || ws.readyState !== WebSocket.OPEN) return; // sent after reconnecting
    ws.send(JSON.stringify({ jsonrpc: "2.0", id, method: call.method, params: call.params }));
  }

  private settleReady(error: Error | null): void {
    for (const w of this.readyWaiters.splice(0)) w(error);
  }

  /** The connection's owner: connect, take part, and on a drop start again. */
  private async own(): Promise<void> {
    let failures = 0;
    while (!this.closing) {
      try {
        const ws = await this.open();
        await this.authenticate(ws);
        if (this.closing) {
          ws.close();
          break;
        }
        this.ws = ws;
        this.logger.info(this.reconnects === 0
          ? `connected to ${this.url} as ${this.agentId}`
          : `connected again to ${this.url} as ${this.agentId} (after ${this.reconnects} drops)`);
        const closed = new Promise<void>((resolve) => ws.once("close", () => resolve()));
        ws.on("message", (raw) => this.read(String(raw)));
        this.resume();
        failures = 0;
        this.settleReady(null);
        await closed;
      } catch (e) {
        // A refused token, a certificate this client does not trust, a URL that is not a
        // WebSocket's: connecting again would not help.
        if (e instanceof AuthenticationFailed || isCertificateError(e) || e instanceof SyntaxError) {
          const fatal = e as Error;
          this.fatal = fatal;
          this.failAll(fatal);
          this.settleReady(fatal);
          return;
        }
        this.lastError = message(e);
        // Said once when the connection is lost, then now and then while it stays down.
        if ((failures & (failures - 1)) === 0) {
          this.logger.warn(`connection to ${this.url} failed: ${this.lastError}; trying again`);
        }
      } finally {
        this.ws = null;
        this.ready = false;
      }
      if (this.closing) break;
      failures += 1;
      this.reconnects += 1;
      const min = this.options.minBackoffMs ?? 50;
      const max = this.options.maxBackoffMs ?? 5000;
      const backoff = Math.min(max, min * 2 ** Math.min(failures, 16));
      await new Promise<void>((resolve) => {
        this.wake = resolve;
        setTimeout(resolve, backoff * (0.5 + Math.random() / 2));
      });
      this.wake = null;
    }
    this.settleReady(new ConnectionClosed("the client was closed"));
  }

  private open(): Promise<WebSocket> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url, { maxPayload: 0, ca: this.options.ca });
      const fail = (e: unknown): void => {
        ws.removeAllListeners();
        ws.on("error", () => {});
        ws.terminate();
        reject(e instanceof Error ? e : new Error(String(e)));
      };
      ws.once("open", () => {
        ws.removeListener("error", fail);
        ws.on("error", () => {}); // a drop shows as "close"
        resolve(ws);
      });
      ws.once("error", fail);
    });
  }

  private authenticate(ws: WebSocket): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => done(new Error("no answer to authenticate within 30 s")), 30_000);
      const done = (e: Error | null): void => {
        clearTimeout(timer);
        ws.removeListener("message", onMessage);
        ws.removeListener("close", onClose);
        if (e) {
          ws.terminate();
          reject(e);
        } else resolve();
      };
      const onMessage = (raw: WebSocket.RawData): void => {
        const msg = JSON.parse(String(raw)) as Json;
        if (msg.id !== 0) return;
        if (msg.error) {
          const e = RpcError.fromWire(msg.error as Json);
          done(e.code === ErrorCode.Unauthenticated ? new AuthenticationFailed(e.message) : e);
          return;
        }
        this.agentId = ((msg.result as Json | undefined)?.agentId as string | undefined) ?? null;
        done(null);
      };
      const onClose = (): void => done(new Error("the connection closed while authenticating"));
      ws.on("message", onMessage);
      ws.once("close", onClose);
      ws.send(JSON.stringify({ jsonrpc: "2.0", id: 0, method: "authenticate", params: { token: this.token } }));
    });
  }

  /**
   * After (re)authenticating: subscriptions and registrations again, then every call still
   * unanswered, in the order they were made.
   */
  private resume(): void {
    const again = [...this.calls.entries()].sort(([a], [b]) => a - b);
    this.ready = true;
    for (const sub of this.subs) {
      if (sub.serverId === null) continue;
      this.call("subscribe", sub.params(), (id) => {
        sub.serverId = id as number;
      }).catch(() => {}); // the next reconnect tries again
    }
    for (const offers of this.offers) {
      if (offers.serverId === null) continue;
      this.call("registerExecutor", { mode: "push" }, (id) => {
        offers.serverId = id as number;
      }).catch(() => {});
    }
    for (const [id, call] of again) this.send(id, call);
  }

  private read(raw: string): void {
    let msg: Json;
    try {
      msg = JSON.parse(raw) as Json;
    } catch {
      return;
    }
    if ("id" in msg && msg.method === undefined) {
      const call = this.calls.get(msg.id as number);
      if (!call) return;
      if (msg.error) call.reject(RpcError.fromWire(msg.error as Json));
      else {
        call.onResult?.(msg.result);
        call.resolve(msg.result);
      }
      return;
    }
    this.subs = route(msg.method, msg.params as Notification | undefined, this.subs, this.offers);
  }

  /** Fails every call waiting, and ends every subscription and registration. */
  private failAll(error: Error): void {
    for (const call of [...this.calls.values()]) call.reject(error);
    for (const sub of this.subs) sub.end();
    for (const offers of this.offers) offers.end();
  }
}

function message(e: unknown): string {
  if (e instanceof Error) return e.message || e.name;
  return String(e);
}
