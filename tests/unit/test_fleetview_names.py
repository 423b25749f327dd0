"""`lpx top` names the hottest adapters through the registry (GET /v1/adapters), asks it at most every
refresh interval, and goes on with digests (and a note saying why) when the registry is away."""

from __future__ import annotations

import httpx

from libs.fleetview.names import AdapterNames, names_from_adapters
from libs.fleetview.render import render_top
from tests.unit.test_fleetview import HOT, WARM, frame_text, snapshot

ROWS = [
    {"tenant": "acme", "name": "support", "current_version": 3, "current_digest": HOT},
    {"tenant": "beta", "name": "draft", "current_version": None, "current_digest": None},  # nothing serves
]


def registry(replies: list) -> tuple[httpx.AsyncClient, list[str]]:
    """A registry answering GET /v1/adapters with `replies` in turn (a status, or an exception to raise)."""
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return httpx.Response(reply, json=ROWS if reply == 200 else {"detail": "no"})

    return httpx.AsyncClient(base_url="http://registry:8100", transport=httpx.MockTransport(handle)), asked


def test_serving_versions_are_named_and_unserved_adapters_are_not():
    assert names_from_adapters(ROWS) == {HOT: "acme/support v3"}


async def test_names_are_asked_once_per_refresh_and_kept_through_a_failed_lookup():
    clock = iter([0.0, 10.0, 31.0, 45.0, 62.0])
    http, asked = registry([200, httpx.ConnectError("refused"), 503])
    names = AdapterNames(http, refresh_s=30.0, clock=lambda: next(clock))
    notes: list[str] = []
    assert await names.current(notes) == {HOT: "acme/support v3"} and notes == []
    assert await names.current(notes) == {HOT: "acme/support v3"} and asked == ["/v1/adapters"]  # cached
    assert await names.current(notes) == {HOT: "acme/support v3"}  # refused: the last names stay
    assert notes == [
        "adapter names: registry at http://registry:8100 unreachable (ConnectError: refused) (digests shown)"
    ]
    notes.clear()
    await names.current(notes)  # not asked again before refresh_s: the note stays
    assert len(asked) == 2 and "unreachable" in notes[0]
    notes.clear()
    await names.current(notes)
    assert notes == ["adapter names: registry at http://registry:8100 answered 503 to GET /v1/adapters (digests shown)"]
    await http.aclose()


def test_the_frame_shows_a_name_where_the_registry_gives_one_and_the_digest_elsewhere():
    text = frame_text(render_top(snapshot(names={HOT: "acme/support v3"})))
    assert "acme/support v3" in text and HOT[:12] not in text
    assert WARM[:12] in text  # an adapter the registry does not name (an older version, say)
    assert snapshot(names={HOT: "acme/support v3"}).to_json()["adapters"][0]["name"] == "acme/support v3"


def test_top_reads_the_gateway_metrics_lpx_up_wrote_and_the_environment_wins(tmp_path, monkeypatch):
    from libs.cli.fleetview_cmds import _default_metrics
    from libs.paths import platform_env_file

    monkeypatch.setenv("LPX_HOME", str(tmp_path))
    monkeypatch.delenv("LPX_TOP_METRICS", raising=False)
    assert _default_metrics() == []  # no platform, nothing set
    platform_env_file().parent.mkdir(parents=True, exist_ok=True)
    platform_env_file().write_text('LPX_TOP_METRICS=["http://127.0.0.1:9999/metrics"]\n')
    assert _default_metrics() == ["http://127.0.0.1:9999/metrics"]
    monkeypatch.setenv("LPX_TOP_METRICS", '["http://gw:9464/metrics"]')
    assert _default_metrics() == ["http://gw:9464/metrics"]
