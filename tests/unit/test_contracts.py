import itertools

import pytest
from pydantic import ValidationError

from libs.contracts import (
    AdapterEvent,
    AdapterEventKind,
    DeadLetter,
    InferenceRequest,
    InferenceResult,
    Message,
    WorkerHeartbeat,
    messages,
    subjects,
)


def _message_classes():
    return [
        obj
        for obj in vars(messages).values()
        if isinstance(obj, type) and issubclass(obj, Message) and obj is not Message
    ]


def test_every_message_type_has_a_version_field():
    classes = _message_classes()
    assert len(classes) >= 10
    for cls in classes:
        assert "schema_version" in cls.model_fields, cls.__name__
        assert cls.model_fields["schema_version"].default == 1


def test_unknown_schema_version_is_refused():
    with pytest.raises(ValidationError):
        InferenceRequest.model_validate_json(
            '{"schema_version": 2, "request_id": "r1", "tenant_id": "t", "base_model": "b", "prompt": "x"}'
        )


def test_unknown_fields_are_refused_not_ignored():
    with pytest.raises(ValidationError):
        InferenceResult(request_id="r", worker_id="w", ok=True, surprise=1)


def test_request_roundtrip_through_json():
    req = InferenceRequest(
        request_id="r-1", tenant_id="t1", base_model="smollm2-135m", messages=[{"role": "user", "content": "hi"}]
    )
    assert InferenceRequest.model_validate_json(req.model_dump_json()) == req


def test_request_id_cannot_smuggle_subject_syntax():
    with pytest.raises(ValidationError):
        InferenceRequest(request_id="a.b>", tenant_id="t", base_model="b", prompt="x")


def test_event_and_heartbeat_defaults():
    event = AdapterEvent(kind=AdapterEventKind.REGISTERED, tenant="t", adapter="a")
    assert len(event.event_id) == 32 and event.ts > 0
    beat = WorkerHeartbeat(worker_id="w", pool="p", base_model="b", max_rank=16, capacity=8, in_flight=0)
    assert beat.adapters == {}


@pytest.mark.parametrize("bad", ["a.b", "*", ">", "has space", "", "x\n"])
def test_subject_tokens_refuse_shape_changing_ids(bad):
    with pytest.raises(ValueError):
        subjects.infer("pool", "worker", bad)


def test_infer_subject_is_keyed_by_pool_worker_adapter():
    assert subjects.infer("smollm2-135m-r16", "w1", "ab12") == "lpx.infer.smollm2-135m-r16.w1.ab12"
    assert subjects.infer_worker_filter("p", "w1") == "lpx.infer.p.w1.>"


def _covers(pattern: str, subject: str) -> bool:
    pat, sub = pattern.split("."), subject.split(".")
    for i, tok in enumerate(pat):
        if tok == ">":
            return len(sub) > i
        if i >= len(sub) or (tok != "*" and tok != sub[i]):
            return False
    return len(pat) == len(sub)


def test_every_published_subject_lands_in_exactly_one_stream():
    samples = [
        subjects.infer("p", "w", "a"),
        subjects.infer_any("p", "a"),
        subjects.submit("t1"),
        subjects.results("r1"),
        subjects.tenant_results("t1", "r1"),
        subjects.adapter_event("registered"),
        subjects.EVALUATED,
        subjects.TRAIN_JOBS,
        subjects.train_progress("j1"),
        subjects.dead_letter("gateway"),
    ]
    for sample in samples:
        owners = [s.name for s in subjects.STREAMS if any(_covers(p, sample) for p in s.subjects)]
        assert len(owners) == 1, (sample, owners)
    # Ephemeral subjects must not be captured by any stream. (Training progress is stored for a day, so
    # that a CLI attaching late still sees where its job is.)
    ephemerals = (
        subjects.tokens("r1"),
        subjects.tenant_tokens("t1", "r1"),
        subjects.RESOLVE,
        subjects.EVAL_CONTEXT,
        subjects.worker_load("p", "w1"),
    )
    for ephemeral in ephemerals:
        assert not any(_covers(p, ephemeral) for s in subjects.STREAMS for p in s.subjects), ephemeral


def test_stream_names_and_subjects_are_unique():
    names = [s.name for s in subjects.STREAMS]
    assert len(names) == len(set(names))
    all_subjects = list(itertools.chain.from_iterable(s.subjects for s in subjects.STREAMS))
    assert len(all_subjects) == len(set(all_subjects))


def test_dead_letter_keeps_payload_and_reason():
    from libs.bus.dead_letters import dead_letter

    dl = dead_letter("worker", "lpx.infer.p.w.a", "invalid JSON", b"\xff{not json", {"Nats-Msg-Id": "1"})
    assert isinstance(dl, DeadLetter)
    assert dl.reason == "invalid JSON" and "{not json" in dl.payload and dl.headers == {"Nats-Msg-Id": "1"}


def test_pool_subject_never_overlaps_a_worker_filter():
    from libs.contracts.subjects import ANY_WORKER

    assert not _covers(subjects.infer_worker_filter("p", "w1"), subjects.infer_any("p", "a"))
    assert _covers(subjects.infer_any_filter("p"), subjects.infer_any("p", "a"))
    assert ANY_WORKER.startswith("_")


def test_worker_ids_may_not_take_the_pool_token():
    from pydantic import ValidationError as VE

    from services.worker.settings import WorkerSettings

    with pytest.raises(VE):
        WorkerSettings(worker_id="_any")
    with pytest.raises(VE):
        WorkerSettings(worker_id="a.b")


def test_a_dead_letter_stays_publishable_whatever_it_stands_for():
    from libs.bus.dead_letters import MAX_DEAD_LETTER_PAYLOAD, dead_letter

    garbage = bytes(range(128, 256)) * 8_000  # 1 MB that is not UTF-8: 3 MB once decoded with replacements
    letter = dead_letter("gateway", "lpx.submit", "invalid SubmitRequest", garbage, {"X-Odd": "v" * 5000})
    assert letter.truncated and letter.payload_bytes == len(garbage)
    assert len(letter.payload) == MAX_DEAD_LETTER_PAYLOAD
    assert len(letter.model_dump_json().encode()) < 512 * 1024  # far under the broker's 1 MiB
    small = dead_letter("worker", "lpx.infer.p.w.base", "bad", b'{"a": 1}')
    assert not small.truncated and small.payload == '{"a": 1}' and small.payload_bytes == 8


def test_a_heartbeat_from_a_newer_worker_is_still_read():
    from libs.contracts import WorkerHeartbeat

    beat = WorkerHeartbeat(worker_id="w", pool="p", base_model="b", max_rank=16, capacity=8, in_flight=0)
    newer = {**beat.model_dump(mode="json"), "a_field_from_the_future": [1, 2]}
    assert WorkerHeartbeat.model_validate(newer).worker_id == "w"
