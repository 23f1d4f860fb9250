"""Listing conversations a page at a time (`listConversations`), which `Client` has."""

from __future__ import annotations

from typing import Any, cast

from .wire import ListConversationsResult, Snapshot

# How the protocol names the filters `list_conversations` takes.
_NAMES = {
    "limit": "limit",
    "cursor": "cursor",
    "status": "status",
    "participant": "participant",
    "scenario": "scenario",
    "metadata": "metadata",
    "created_after": "createdAfter",
    "updated_after": "updatedAfter",
    "query": "query",
    "tenant": "tenant",
}


class ListingMethods:
    """The listing methods of a client; `call` is the client's."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:  # pragma: no cover
        raise NotImplementedError

    async def list_conversations(self, **filters: Any) -> ListConversationsResult:
        """`listConversations`: a page, newest activity first: `{conversations, nextCursor?}`.
        Filters: `limit` (1-1000, default 100), `cursor` (the page before's `nextCursor`),
        `status` (`active`, `paused`, `closed`, `open`), `participant`, `scenario`,
        `metadata` (a dict each key of which must match), `created_after`, `updated_after`
        (RFC 3339), `query` (text in ids and metadata), `tenant` (operators)."""
        unknown = set(filters) - set(_NAMES)
        if unknown:
            raise TypeError(f"list_conversations: unknown filters {sorted(unknown)}")
        params = {_NAMES[k]: v for k, v in filters.items() if v is not None}
        return cast(ListConversationsResult, await self.call("listConversations", params))

    async def all_conversations(self, *, max_pages: int = 1000, **filters: Any) -> list[Snapshot]:
        """Every conversation `list_conversations` answers for `filters`, page after page (at
        most `max_pages` pages of up to 1,000)."""
        filters.setdefault("limit", 1000)
        found: list[Snapshot] = []
        for _ in range(max_pages):
            page = await self.list_conversations(**filters)
            found.extend(page["conversations"])
            cursor = page.get("nextCursor")
            if cursor is None:
                break
            filters["cursor"] = cursor
        return found
