#!/opt/s3/bin/python
"""MinIO's place in infra/compose/local.yaml, taken by SeaweedFS `weed mini` (one process: master, volume,
filer and an S3 gateway), run as the local stack runs it (libs/stack/servers.py).

Installed as both `minio` and `mc` in the s3 image, it answers the part of their command lines that
compose.yaml uses, so compose.yaml's own command, healthcheck and bucket creation run unchanged:

    minio server DATA_DIR [--console-address ADDR]   S3 on :9000 for MINIO_ROOT_USER / MINIO_ROOT_PASSWORD
    mc ready local                                    the healthcheck: S3 answers and those credentials work
    mc alias set NAME URL ACCESS_KEY SECRET_KEY       remembered in ~/.mc/config.json, as mc does
    mc mb [--ignore-existing] NAME/BUCKET             the bucket exists afterwards
"""

import json
import os
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from minio import Minio

S3_PORT = 9000
ALIASES = Path.home() / ".mc" / "config.json"


def fail(message: str) -> None:
    sys.exit(f"{Path(sys.argv[0]).name}: {message}")


def minio(args: list[str]) -> None:
    if not args or args[0] != "server":
        fail("only `minio server DATA_DIR` is provided here")
    data = Path(args[1])
    scratch = data / ".lpx-s3"
    scratch.mkdir(parents=True, exist_ok=True)
    identity = {
        "name": "root",
        "credentials": [{"accessKey": os.environ["MINIO_ROOT_USER"], "secretKey": os.environ["MINIO_ROOT_PASSWORD"]}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config = scratch / "s3.json"
    config.write_text(json.dumps({"identities": [identity]}))
    config.chmod(0o600)
    # The console (--console-address) has no counterpart and is ignored. Master, volume and filer talk
    # over loopback inside the container; only S3 is for the other containers.
    command = ["weed", f"-logdir={scratch}", "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=0.0.0.0"]
    command += [f"-s3.port={S3_PORT}", f"-s3.config={config}", "-admin.ui=false", "-webdav=false"]
    command += ["-master.telemetry=false"]
    os.environ["TMPDIR"] = str(scratch)  # weed's scratch files stay in the volume
    os.execvp("weed", command)


def client(alias: str) -> Minio:
    if alias == "local":  # as in the MinIO image: this container's server, its root credentials
        return Minio(
            f"127.0.0.1:{S3_PORT}", os.environ["MINIO_ROOT_USER"], os.environ["MINIO_ROOT_PASSWORD"], secure=False
        )
    saved = json.loads(ALIASES.read_text())["aliases"] if ALIASES.exists() else {}
    if alias not in saved:
        fail(f"no alias {alias} (mc alias set first)")
    url = urlparse(saved[alias]["url"])
    return Minio(url.netloc, saved[alias]["accessKey"], saved[alias]["secretKey"], secure=url.scheme == "https")


def mc(args: list[str]) -> None:
    match args:
        case ["ready", "local"]:
            urllib.request.urlopen(f"http://127.0.0.1:{S3_PORT}/healthz", timeout=2)
            client("local").list_buckets()  # the credentials work, not only the port
        case ["alias", "set", name, url, access_key, secret_key]:
            saved = json.loads(ALIASES.read_text()) if ALIASES.exists() else {"aliases": {}}
            saved["aliases"][name] = {"url": url, "accessKey": access_key, "secretKey": secret_key}
            ALIASES.parent.mkdir(parents=True, exist_ok=True)
            ALIASES.write_text(json.dumps(saved))
        case ["mb", *flags, target] if set(flags) <= {"--ignore-existing"}:
            alias, _, bucket = target.partition("/")
            store = client(alias)
            if store.bucket_exists(bucket):
                if not flags:
                    fail(f"bucket {bucket} exists")
            else:
                store.make_bucket(bucket)
            print(f"Bucket created successfully `{target}`.")
        case _:
            fail(f"not provided here: mc {' '.join(args)}")


if __name__ == "__main__":
    {"minio": minio, "mc": mc}[Path(sys.argv[0]).name](sys.argv[1:])
