"""A tenant admin's token methods (`createToken`, `listTokens`, `revokeToken`), which
`Client` has."""

from __future__ import annotations

from typing import Any, cast

from .wire import CreateTokenResult, ListTokensResult, RevokeTokenResult


class TokenMethods:
    """The token methods of a client; `call` is the client's."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:  # pragma: no cover
        raise NotImplementedError

    async def create_token(
        self, agent_id: str, *, admin: bool = False, expires_in_ms: int | None = None
    ) -> CreateTokenResult:
        """`createToken` (the tenant's admins): `{token, info}`, the token shown this once."""
        params: dict[str, Any] = {"agentId": agent_id}
        if admin:
            params["admin"] = True
        if expires_in_ms is not None:
            params["expiresInMs"] = expires_in_ms
        return cast(CreateTokenResult, await self.call("createToken", params))

    async def list_tokens(self) -> ListTokensResult:
        """`listTokens` (the tenant's admins): `{tokens}`, never the tokens themselves."""
        return cast(ListTokensResult, await self.call("listTokens", {}))

    async def revoke_token(
        self, token_id: str | None = None, *, agent_id: str | None = None
    ) -> RevokeTokenResult:
        """`revokeToken` (the tenant's admins): by the token's id, or every token of
        `agent_id`; `{revoked}`."""
        params: dict[str, Any] = {}
        if token_id is not None:
            params["id"] = token_id
        if agent_id is not None:
            params["agentId"] = agent_id
        return cast(RevokeTokenResult, await self.call("revokeToken", params))
