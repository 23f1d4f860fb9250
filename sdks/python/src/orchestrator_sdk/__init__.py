"""The conversation orchestrator's protocol in Python: `Client`, a connection that keeps itself
alive (reconnect, re-authenticate, resume subscriptions from their cursors, send unanswered
calls again with their idempotency keys), and the protocol's errors, typed."""

from .client import Client, Offers, Subscription
from .errors import AuthenticationFailed, ConnectionClosed, ErrorCode, OrchestratorError, RpcError

__all__ = [
    "AuthenticationFailed",
    "Client",
    "ConnectionClosed",
    "ErrorCode",
    "Offers",
    "OrchestratorError",
    "RpcError",
    "Subscription",
]
