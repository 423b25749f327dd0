"""The cold adapter (and dataset) store: any S3 API through the `minio` client (MinIO in compose,
SeaweedFS locally). Keys are content-addressed; every upload is verified and every download is
checked against the digest it was asked for, so corrupted or swapped bytes never pass silently."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from minio import Minio
from minio.error import S3Error
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from libs.hashing import file_sha256
from libs.lora.format import ADAPTER_FILES, digest_of_files
from libs.settings import ConnectionSettings

log = logging.getLogger(__name__)

SHA_META = "sha256"  # stored as x-amz-meta-sha256 on every object


class ObjectStoreError(RuntimeError):
    pass


class DigestMismatch(ObjectStoreError):
    """Bytes in the store do not hash to the digest they are filed under."""


def adapter_prefix(digest: str) -> str:
    return f"adapters/sha256/{digest}/"


def dataset_key(digest: str) -> str:
    return f"datasets/sha256/{digest}.jsonl"


_transient = retry(
    retry=retry_if_exception_type((ConnectionError, OSError)),
    wait=wait_exponential(multiplier=0.2, max=2),
    stop=stop_after_attempt(3),
    reraise=True,
)


class ObjectStore:
    def __init__(self, conn: ConnectionSettings, bucket: str | None = None) -> None:
        self.bucket = bucket or conn.s3_bucket
        self.client = Minio(
            conn.s3_endpoint,
            access_key=conn.s3_access_key,
            secret_key=conn.s3_secret_key,
            secure=conn.s3_secure,
            region=conn.s3_region,
        )

    @_transient
    def ensure_bucket(self) -> None:
        if not self.client.bucket_exists(self.bucket):
            try:
                self.client.make_bucket(self.bucket)
            except S3Error as exc:
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

    # --- single objects ------------------------------------------------------------------------
    @_transient
    def put_file(self, key: str, path: Path, sha256: str | None = None) -> str:
        """Upload and verify (size and recorded sha256 read back). Returns the file's sha256."""
        sha256 = sha256 or file_sha256(path)
        size = path.stat().st_size
        self.client.fput_object(self.bucket, key, str(path), metadata={SHA_META: sha256})
        stat = self.client.stat_object(self.bucket, key)
        recorded = (stat.metadata or {}).get(f"x-amz-meta-{SHA_META}") or (stat.metadata or {}).get(SHA_META)
        if stat.size != size or recorded != sha256:
            raise ObjectStoreError(f"upload of {key} did not verify (size {stat.size}/{size}, sha {recorded})")
        return sha256

    @_transient
    def get_file(self, key: str, dest: Path, expected_sha256: str | None = None) -> str:
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.fget_object(self.bucket, key, str(dest))
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                raise ObjectStoreError(f"object {key} not found in bucket {self.bucket}") from None
            raise
        actual = file_sha256(dest)
        if expected_sha256 and actual != expected_sha256:
            dest.unlink(missing_ok=True)
            raise DigestMismatch(f"{key}: sha256 {actual} != expected {expected_sha256}")
        return actual

    def exists(self, key: str) -> bool:
        try:
            self.client.stat_object(self.bucket, key)
            return True
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                return False
            raise

    def delete_prefix(self, prefix: str) -> int:
        names = [o.object_name for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)]
        for name in names:
            self.client.remove_object(self.bucket, name)
        return len(names)

    # --- adapters ------------------------------------------------------------------------------
    def put_adapter(self, directory: Path, file_digests: dict[str, str] | None = None) -> tuple[str, str]:
        """Upload an adapter directory under its content address. Returns (digest, prefix)."""
        file_digests = file_digests or {name: file_sha256(directory / name) for name in ADAPTER_FILES}
        digest = digest_of_files(file_digests)
        prefix = adapter_prefix(digest)
        for name in ADAPTER_FILES:
            self.put_file(prefix + name, directory / name, file_digests[name])
        return digest, prefix

    def get_adapter(self, digest: str, prefix: str, dest: Path) -> Path:
        """Download into `dest` (atomically: a partial download is never visible there) and check
        that the files hash to `digest`. Raises DigestMismatch otherwise."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=dest.parent))
        try:
            files = {name: self.get_file(prefix + name, staging / name) for name in ADAPTER_FILES}
            actual = digest_of_files(files)
            if actual != digest:
                raise DigestMismatch(f"adapter {digest[:12]}: stored files hash to {actual[:12]}")
            if dest.exists():
                shutil.rmtree(dest)
            staging.rename(dest)
            return dest
        finally:
            shutil.rmtree(staging, ignore_errors=True)
