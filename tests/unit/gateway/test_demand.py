"""The gateway's demand counts (what workers pre-load): per pool, most requested first, decayed."""

from __future__ import annotations

import hashlib

from libs.contracts import AdapterRef
from services.gateway.demand import DemandCounter


def ref(i: int) -> AdapterRef:
    digest = hashlib.sha256(f"a{i}".encode()).hexdigest()
    return AdapterRef(digest=digest, object_key=f"adapters/{digest}/", base_model="m", rank=8)


def test_counts_per_pool_most_requested_first():
    counter = DemandCounter(half_life_s=60)
    for _ in range(3):
        counter.seen("p1", ref(1))
    counter.seen("p1", ref(2))
    counter.seen("p2", ref(3))
    top = counter.top("p1")
    assert [(e.ref, e.requests) for e in top] == [(ref(1), 3.0), (ref(2), 1.0)]
    assert counter.pools == ["p1", "p2"] and counter.top("p1", limit=1)[0].ref == ref(1)


def test_old_requests_fade_with_the_half_life_and_vanish():
    counter = DemandCounter(half_life_s=60)
    counter.decay(1000.0)
    for _ in range(4):
        counter.seen("p", ref(1))
    counter.decay(1060.0)
    assert counter.top("p")[0].requests == 2.0
    counter.decay(1060.0 + 60 * 20)  # 2 / 2**20: below the floor, forgotten
    assert counter.top("p") == [] and counter.pools == []
