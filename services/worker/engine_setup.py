"""The worker's engine and its admission policy, from the worker's settings."""

from __future__ import annotations

from libs.engine import EngineConfig
from libs.engine.profile import load_profile
from services.worker.admission import AdapterAdmission
from services.worker.engine_admission import EngineAdmission
from services.worker.settings import WorkerSettings


def engine_config(s: WorkerSettings) -> EngineConfig:
    sim = {"prefill_tok_s": s.sim_prefill_tok_s, "decode_tok_s": s.sim_decode_tok_s}
    if s.engine == "sim" and s.sim_profile is not None:
        profile = load_profile(s.sim_profile, s.base_model)
        if profile is not None:  # else (logged) the fixed rates above
            sim |= {"prefill_tok_s": profile.prefill_tok_s, "decode_step_s": profile.decode_step_s}
    return EngineConfig(
        model_path=s.resolved_model_path(),
        engine=s.engine,
        sim=sim,
        served_model_name=s.base_model,
        device=s.device,
        max_loras=s.max_loras,
        max_cpu_loras=s.max_cpu_loras,
        max_lora_rank=s.max_lora_rank,
        max_num_seqs=s.max_num_seqs,
        max_model_len=s.max_model_len,
        cpu_kvcache_gib=s.cpu_kvcache_gib,
    )


def admission_for(settings: WorkerSettings) -> AdapterAdmission | EngineAdmission | None:
    if settings.admission == "engine":
        return EngineAdmission(settings.max_adapter_wait_s)
    if settings.admission == "grouped":
        return AdapterAdmission(settings.max_loras, settings.max_adapter_wait_s)
    return None
