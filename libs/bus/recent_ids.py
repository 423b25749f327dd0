"""A bounded set of request ids answered recently: the fast path of duplicate suppression, shared by the
gateway (results already delivered) and the worker (requests already answered). The oldest id goes
first once the bound is reached; the stored results in JetStream remain the slow, complete path."""

from __future__ import annotations

from collections import OrderedDict


class RecentIds:
    def __init__(self, limit: int = 50_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, request_id: str) -> None:
        self._ids[request_id] = None
        self._ids.move_to_end(request_id)
        if len(self._ids) > self._limit:
            self._ids.popitem(last=False)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
