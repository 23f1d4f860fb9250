// The partner agent in TypeScript: answers each of its turns with what it was told. Logs its
// connection and turns to stderr; gives up on an unreachable ORCHESTRATOR_URL after 10 s.
// Run: ORCHESTRATOR_URL=ws://127.0.0.1:7300/rpc ORCHESTRATOR_TOKEN=oct_… node dist/agent.js [push|pull]
import { type Agent, type AgentContext, Client, ExternalExecutor, type Logger, TurnOutcome } from "orchestrator-sdk";

class Echo implements Agent {
  async handleTurn(ctx: AgentContext) {
    const history = await ctx.history();
    const last = (history.at(-1)?.payload as { text?: string } | undefined)?.text ?? "";
    await ctx.say(`You said: ${last}`);
    return TurnOutcome.Posted;
  }
}

const line = (level: string) => (m: string) => console.error(`${new Date().toISOString()} ${level} ${m}`);
const logger: Logger = { debug() {}, info: line("INFO"), warn: line("WARN") };
const stop = (message: string): never => { console.error(`partner-agent: ${message}`); process.exit(1); };
const url = process.env.ORCHESTRATOR_URL ?? "ws://127.0.0.1:7300/rpc";
const token = process.env.ORCHESTRATOR_TOKEN ?? stop("ORCHESTRATOR_TOKEN is not set: orchestrator token create --agent ID");
const connectTimeoutMs = Number(process.env.ORCHESTRATOR_CONNECT_TIMEOUT ?? "10") * 1000;
const client = await Client.connect(url, token, { logger, connectTimeoutMs }).catch((e: Error) => stop(e.message));
const executor = new ExternalExecutor(client, new Echo());
if (process.argv[2] === "pull") await executor.runPull();
else await executor.runPush();
