/**
 * The conversation orchestrator's protocol in TypeScript: `Client`, a connection that keeps
 * itself alive (reconnect, re-authenticate, resume subscriptions from their cursors, send
 * unanswered calls again with their idempotency keys), the protocol's errors, typed, the wire
 * types generated from the protocol's JSON Schemas, and the agent model: `Agent`,
 * `AgentContext`, `TurnOutcome`, and `ExternalExecutor` in pull or push-claim mode.
 */

export { type Agent, AgentContext, DeadlineExceeded, TurnOutcome } from "./agent.js";
export { Client, type ClientOptions, type Json, type Logger, newKey, Offers, Subscription } from "./client.js";
export { AuthenticationFailed, ConnectionClosed, ErrorCode, errorName, OrchestratorError, RpcError } from "./errors.js";
export { type Assignment, ExecPolicy, ExecutorCore, ExternalExecutor, type RunReport, stillMine } from "./executor.js";
export type * from "./wire.js";
