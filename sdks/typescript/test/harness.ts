/**
 * What the SDK's tests share: the real `orchestrator` binary on 127.0.0.1 (`ORCHESTRATOR_BIN`,
 * else the workspace's debug build), on SQLite or, with ORCHESTRATOR_TEST_BACKEND=postgres, on
 * a new database of the PostgreSQL that ORCHESTRATOR_TEST_PG names; tokens minted with the
 * binary; a TCP proxy that cuts every connection through it; and reading a whole log.
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import type { Client, Event } from "../src/index.js";

/** The repository's root (this file is sdks/typescript/dist/test/harness.js once built). */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
export const BIN = process.env.ORCHESTRATOR_BIN ?? path.join(ROOT, "target", "debug", "orchestrator");

let databases = 0;

function database(dir: string): string {
  const backend = process.env.ORCHESTRATOR_TEST_BACKEND ?? "sqlite";
  if (backend === "sqlite") return path.join(dir, "sdk.db");
  if (backend !== "postgres") throw new Error(`ORCHESTRATOR_TEST_BACKEND=${backend}: expected sqlite or postgres`);
  const url = process.env.ORCHESTRATOR_TEST_PG;
  if (!url) throw new Error("ORCHESTRATOR_TEST_BACKEND=postgres needs ORCHESTRATOR_TEST_PG (a postgres:// URL)");
  const name = `ts_${process.pid}_${databases++}_${Date.now()}`;
  execFileSync("psql", [url, "-qc", `CREATE DATABASE ${name}`], { timeout: 30_000 });
  return `${url.slice(0, url.lastIndexOf("/"))}/${name}`;
}

/** A server of its own: its WebSocket `url`, `port`, and tokens for admin, alice and bob. */
export class Server {
  url = "";
  port = 0;
  tokens: Record<string, string> = {};
  private proc: ChildProcess | null = null;
  private readonly dir = mkdtempSync(path.join(tmpdir(), "orchestrator-sdk-ts-"));
  private readonly db = database(this.dir);

  /** A token for `agent`, minted by the binary. */
  token(agent: string, admin = false): string {
    const args = ["token", "create", "--agent", agent, "--db", this.db, ...(admin ? ["--admin"] : [])];
    return execFileSync(BIN, args, { timeout: 30_000, encoding: "utf8" }).trim();
  }

  /** Starts a server (`extra`: more arguments to `serve`, such as `--tls-cert`). */
  static async start(extra: string[] = []): Promise<Server> {
    const s = new Server();
    s.tokens = { admin: s.token("admin", true), alice: s.token("alice"), bob: s.token("bob") };
    const proc = spawn(BIN, ["serve", "--listen", "127.0.0.1:0", "--db", s.db, ...extra], {
      stdio: ["ignore", "pipe", "ignore"],
    });
    s.proc = proc;
    const first = await new Promise<string>((resolve, reject) => {
      const lines = createInterface({ input: proc.stdout! });
      lines.once("line", resolve);
      proc.once("exit", (code) => reject(new Error(`the server exited (${code}) before listening`)));
    });
    const m = /(wss?:\/\/\S+\/rpc)/.exec(first);
    if (!m?.[1]) throw new Error(`no address in ${JSON.stringify(first)}`);
    s.url = m[1];
    s.port = Number(new URL(s.url).port);
    return s;
  }

  stop(): void {
    this.proc?.kill("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A new CA and a certificate it signed for 127.0.0.1, made by the `test-certs` binary built
 * beside the orchestrator: the paths of the CA, the certificate and its key.
 */
export function makeCerts(dir: string): { ca: string; cert: string; key: string } {
  const out = execFileSync(path.join(path.dirname(BIN), "test-certs"), [dir, "ts"], { encoding: "utf8", timeout: 30_000 });
  const [ca, cert, key] = out.trim().split(/\s+/) as [string, string, string];
  return { ca, cert, key };
}

/** A TCP proxy on 127.0.0.1 in front of the server that can cut every connection through it. */
export class CuttingProxy {
  url = "";
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  private server: net.Server | null = null;

  constructor(private readonly targetPort: number) {}

  async start(): Promise<this> {
    this.server = net.createServer((down) => {
      const up = net.connect(this.targetPort, "127.0.0.1");
      const pair: [net.Socket, net.Socket] = [down, up];
      this.pairs.add(pair);
      const end = (): void => {
        down.destroy();
        up.destroy();
        this.pairs.delete(pair);
      };
      down.on("error", end).on("close", end);
      up.on("error", end).on("close", end);
      down.pipe(up);
      up.pipe(down);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    const port = (this.server!.address() as net.AddressInfo).port;
    this.url = `ws://127.0.0.1:${port}/rpc`;
    return this;
  }

  /** Cuts every connection through the proxy at once (both sides, mid-stream). */
  cut(): void {
    for (const [down, up] of this.pairs) {
      down.resetAndDestroy();
      up.resetAndDestroy();
    }
    this.pairs.clear();
  }

  close(): void {
    this.cut();
    this.server?.close();
  }
}

/** Every event of a conversation, page by page. */
export async function wholeLog(client: Client, conversationId: string): Promise<Event[]> {
  const events: Event[] = [];
  let since = 0;
  for (;;) {
    const page = await client.tail(conversationId, since, 1000);
    if (page.events.length === 0) return events;
    events.push(...page.events);
    since = page.events[page.events.length - 1]!.seq;
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `predicate` every 20 ms for at most `ms`; whether it held. */
export async function until(predicate: () => boolean | Promise<boolean>, ms = 10_000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await predicate()) return true;
    await sleep(20);
  }
  return false;
}
