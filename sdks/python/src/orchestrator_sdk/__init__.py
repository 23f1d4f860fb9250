"""The conversation orchestrator's protocol in Python: `Client`, a connection that keeps itself
alive (reconnect, re-authenticate, resume subscriptions from their cursors, send unanswered
calls again with their idempotency keys), the protocol's errors, typed, and the agent model:
`Agent`, `AgentContext`, `TurnOutcome`, and `ExternalExecutor` in pull or push-claim mode."""

from .agent import Agent, AgentContext, TurnOutcome
from .client import Client
from .streams import Offers, Subscription
from .errors import AuthenticationFailed, ConnectionClosed, ErrorCode, OrchestratorError, RpcError
from .executor import Assignment, ExecPolicy, ExecutorCore, ExternalExecutor, RunReport

__all__ = [
    "Agent",
    "AgentContext",
    "Assignment",
    "AuthenticationFailed",
    "Client",
    "ConnectionClosed",
    "ErrorCode",
    "ExecPolicy",
    "ExecutorCore",
    "ExternalExecutor",
    "Offers",
    "OrchestratorError",
    "RpcError",
    "RunReport",
    "Subscription",
    "TurnOutcome",
]
