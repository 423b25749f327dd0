"""The bounded set of recently answered request ids: the oldest goes first, a re-added id is fresh."""

from libs.bus.recent_ids import RecentIds


def test_the_oldest_id_goes_once_the_bound_is_reached():
    recent = RecentIds(limit=3)
    for rid in ("a", "b", "c"):
        recent.add(rid)
    recent.add("a")  # seen again: now the newest
    recent.add("d")
    assert "b" not in recent
    assert all(rid in recent for rid in ("a", "c", "d"))
    assert len(recent) == 3
