"""Names for the digests the workers report: `lpx top` shows `acme/support v3` instead of a digest prefix.

Workers know adapters by digest only (content addressing is what makes a version immutable); the
registry knows which tenant's adapter each digest is. One `GET /v1/adapters` (admin) maps every
adapter's serving version to its name; it is asked again at most every `refresh_s`, so a live view
does not load the registry once a second. A digest the registry does not name (an older version still
resident, or no registry at hand) is shown as its prefix, and why is a note under the view."""

from __future__ import annotations

import time
from collections.abc import Callable

from libs.fleetview.sources import describe


def names_from_adapters(adapters: list[dict]) -> dict[str, str]:
    """Registry `GET /v1/adapters` rows -> {serving digest: "tenant/adapter vN"}."""
    return {
        row["current_digest"]: f"{row['tenant']}/{row['name']} v{row['current_version']}"
        for row in adapters
        if row.get("current_digest")
    }


class AdapterNames:
    def __init__(self, http, *, refresh_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.http = http  # an httpx.AsyncClient with the registry's base URL and admin token
        self.refresh_s = refresh_s
        self._clock = clock
        self._names: dict[str, str] = {}
        self._asked_at: float | None = None
        self._problem = ""  # why the last lookup failed ("" when it did not)

    async def current(self, notes: list[str]) -> dict[str, str]:
        """The names, asked again when `refresh_s` has passed; a failed lookup keeps the last names and
        adds a note (the view goes on without names rather than stopping)."""
        now = self._clock()
        if self._asked_at is None or now - self._asked_at >= self.refresh_s:
            self._asked_at = now
            await self._refresh()
        if self._problem:
            notes.append(f"adapter names: {self._problem} (digests shown)")
        return self._names

    async def _refresh(self) -> None:
        try:
            reply = await self.http.get("/v1/adapters")
        except Exception as exc:
            self._problem = f"registry at {self.http.base_url} unreachable ({describe(exc)})"
            return
        if reply.status_code != 200:
            self._problem = f"registry at {self.http.base_url} answered {reply.status_code} to GET /v1/adapters"
            return
        self._names, self._problem = names_from_adapters(reply.json()), ""
