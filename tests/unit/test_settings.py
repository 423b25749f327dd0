from pydantic_settings import SettingsConfigDict

from libs.settings import ConnectionSettings, ServiceSettings


class DemoServiceSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_DEMO_", extra="ignore")

    widgets: int = 3


def test_service_prefix_and_shared_connections(monkeypatch, tmp_path):
    env_file = tmp_path / "stack.env"
    env_file.write_text("LPX_NATS_URL=nats://10.9.9.9:4222\nLPX_DEMO_WIDGETS=7\nLPX_S3_BUCKET=from-file\n")
    monkeypatch.setenv("LPX_S3_BUCKET", "from-env")
    monkeypatch.setenv("LPX_DEMO_LOG_LEVEL", "DEBUG")
    settings = DemoServiceSettings.load(env_file)
    assert settings.widgets == 7  # from the env file, with the service's prefix
    assert settings.log_level == "DEBUG"
    assert settings.connections.nats_url == "nats://10.9.9.9:4222"
    assert settings.connections.s3_bucket == "from-env"  # real env beats the file


def test_other_services_prefixes_do_not_leak(monkeypatch, tmp_path):
    monkeypatch.setenv("LPX_GATEWAY_WIDGETS", "99")
    assert DemoServiceSettings.load(tmp_path / "missing.env").widgets == 3


def test_missing_env_file_falls_back_to_defaults(tmp_path):
    assert ConnectionSettings.load(tmp_path / "nope.env").nats_url.startswith("nats://")
