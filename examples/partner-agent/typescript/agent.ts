// The partner agent in TypeScript: answers each of its turns with what it was told.
// Run: ORCHESTRATOR_URL=ws://127.0.0.1:7300/rpc ORCHESTRATOR_TOKEN=oct_… node dist/agent.js [push|pull]
import { type Agent, type AgentContext, Client, ExternalExecutor, TurnOutcome } from "orchestrator-sdk";

class Echo implements Agent {
  async handleTurn(ctx: AgentContext) {
    const history = await ctx.history();
    const last = (history.at(-1)?.payload as { text?: string } | undefined)?.text ?? "";
    await ctx.say(`You said: ${last}`);
    return TurnOutcome.Posted;
  }
}

const url = process.env.ORCHESTRATOR_URL ?? "ws://127.0.0.1:7300/rpc";
const token = process.env.ORCHESTRATOR_TOKEN;
if (!token) throw new Error("ORCHESTRATOR_TOKEN is not set: orchestrator token create --agent ID");
const client = await Client.connect(url, token);
const executor = new ExternalExecutor(client, new Echo());
if (process.argv[2] === "pull") await executor.runPull();
else await executor.runPush();
