"""A tenant admin's token methods (`createToken`, `listTokens`, `revokeToken`; an operator
names any `tenant`) and an operator's tenant methods (`createTenant`, `listTenants`), which
`Client` has."""

from __future__ import annotations

from typing import Any, cast

from .wire import (
    CreateTokenResult,
    ListTenantsResult,
    ListTokensResult,
    RevokeTokenResult,
    TenantQuotas,
    TenantSummary,
)


class TokenMethods:
    """The token methods of a client; `call` is the client's."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:  # pragma: no cover
        raise NotImplementedError

    async def create_token(
        self,
        agent_id: str,
        *,
        admin: bool = False,
        expires_in: int | str | None = None,
        tenant: str | None = None,
    ) -> CreateTokenResult:
        """`createToken` (the tenant's admins): `{token, id, tenant, agentId, admin, expiresMs?}`,
        the token shown this once. `expires_in`: milliseconds, or text such as `"30d"`."""
        params: dict[str, Any] = {"agentId": agent_id}
        if tenant is not None:
            params["tenant"] = tenant
        if admin:
            params["admin"] = True
        if expires_in is not None:
            params["expiresIn"] = expires_in
        return cast(CreateTokenResult, await self.call("createToken", params))

    async def list_tokens(self, tenant: str | None = None) -> ListTokensResult:
        """`listTokens` (the tenant's admins): `{tokens}`, never the tokens themselves."""
        params: dict[str, Any] = {} if tenant is None else {"tenant": tenant}
        return cast(ListTokensResult, await self.call("listTokens", params))

    async def revoke_token(
        self, token_id: str | None = None, *, agent_id: str | None = None, tenant: str | None = None
    ) -> RevokeTokenResult:
        """`revokeToken` (the tenant's admins): by the token's id, or every token of
        `agent_id`; `{revoked}`."""
        params: dict[str, Any] = {}
        if token_id is not None:
            params["id"] = token_id
        if agent_id is not None:
            params["agentId"] = agent_id
        if tenant is not None:
            params["tenant"] = tenant
        return cast(RevokeTokenResult, await self.call("revokeToken", params))

    async def create_tenant(self, name: str) -> TenantSummary:
        """`createTenant` (operators)."""
        return cast(TenantSummary, await self.call("createTenant", {"name": name}))

    async def list_tenants(self) -> ListTenantsResult:
        """`listTenants` (operators): `{tenants}`, each with its quotas."""
        return cast(ListTenantsResult, await self.call("listTenants", {}))

    async def set_tenant_quotas(self, tenant: str, quotas: TenantQuotas) -> TenantSummary:
        """`setTenantQuotas` (operators): replaces the tenant's quotas (an absent one is the
        server's default); the tenant as it is now."""
        params = {"tenant": tenant, "quotas": dict(quotas)}
        return cast(TenantSummary, await self.call("setTenantQuotas", params))
