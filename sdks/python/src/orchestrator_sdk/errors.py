"""The protocol's errors, typed: each code of PROTOCOL.md §11 is an `ErrorCode`, and a refusal
from the server is an `RpcError` carrying it (`tests/python/test_sdk_python.py` fails when
this table and `proto-spec/openrpc.json` drift apart)."""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.IntEnum):
    """A JSON-RPC error code of the protocol."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL = -32603
    BATCH_NOT_SUPPORTED = -32005
    TOO_MANY_SUBSCRIPTIONS = -32006
    FRAME_TOO_LARGE = -32007
    RESPONSE_TOO_LARGE = -32008
    UNAUTHENTICATED = -32001
    FORBIDDEN = -32002
    CONVERSATION_NOT_FOUND = -32003
    CONVERSATION_EXISTS = -32004
    CONVERSATION_CLOSED = -32010
    TURN_CLOSED = -32011
    NOT_YOUR_TURN = -32012
    TURN_MISMATCH = -32013
    INVALID_FINALITY = -32014
    IDEMPOTENCY_KEY_REUSED = -32015
    CONVERSATION_PAUSED = -32016
    MODE_NOT_SUPPORTED = -32017
    CLAIM_NOT_FOUND = -32020
    RATE_LIMITED = -32029
    PAYLOAD_TOO_LARGE = -32030
    SUBCONVERSATION_LIMIT = -32031
    QUOTA_EXCEEDED = -32032
    TENANT_QUOTA_EXCEEDED = -32033

    @property
    def wire_name(self) -> str:
        """The name the server puts in `data.error` (`NotYourTurn`)."""
        return "".join(part.capitalize() for part in self.name.split("_"))


class OrchestratorError(Exception):
    """Anything this SDK raises."""


class RpcError(OrchestratorError):
    """The server refused a call: `code` (an `ErrorCode`, or the bare number for a code this
    SDK does not know), `message` for people, `data` for programs (`currentTurn`, `limit`,
    `retryAfterMs`, …)."""

    def __init__(self, code: ErrorCode | int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({_name(code)}, {int(code)})")
        self.code = code
        self.message = message
        self.data = data

    @classmethod
    def from_wire(cls, error: dict[str, Any]) -> "RpcError":
        """The error object of a JSON-RPC answer."""
        raw = int(error.get("code", ErrorCode.INTERNAL))
        try:
            code: ErrorCode | int = ErrorCode(raw)
        except ValueError:
            code = raw
        return cls(code, str(error.get("message", "")), error.get("data"))


class ConnectionClosed(OrchestratorError):
    """The client was closed (by `Client.close`) while the call waited."""


class AuthenticationFailed(OrchestratorError):
    """The server refused the token; reconnecting would not help."""


def _name(code: ErrorCode | int) -> str:
    return code.wire_name if isinstance(code, ErrorCode) else "unknown code"
