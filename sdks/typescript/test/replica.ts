/**
 * A push replica of one agent on the TypeScript SDK, run as its own process by
 * executor.test.ts (which SIGKILLs one mid-turn). Usage: replica.js URL TOKEN MARKS_DIR NAME.
 *
 * Its agent posts progress, says which turn it holds (a file MARKS_DIR/NAME.TURN), waits a
 * moment, then answers. Its writes are the same whichever replica makes them, so a turn taken
 * over by another replica writes nothing twice.
 */

import { writeFileSync } from "node:fs";
import path from "node:path";

import { type Agent, type AgentContext, Client, ExternalExecutor, TurnOutcome } from "../src/index.js";

const [url, token, marks, name] = process.argv.slice(2) as [string, string, string, string];

const answerer: Agent = {
  async handleTurn(ctx: AgentContext) {
    await ctx.say(`working on turn ${ctx.turn}`, "none");
    writeFileSync(path.join(marks, `${name}.${ctx.turn}`), "");
    await new Promise((resolve) => setTimeout(resolve, 300));
    await ctx.say(`answer to turn ${ctx.turn}`);
    return TurnOutcome.Posted;
  },
};

const client = await Client.connect(url, token);
console.log("ready");
await new ExternalExecutor(client, answerer).runPush();
