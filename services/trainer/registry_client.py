"""The trainer's side of the registry's admin HTTP API: push a trained version, report a failed
migration item. Connection errors and 5xx are retried (tenacity); a 4xx is the registry's refusal
and is not."""

from __future__ import annotations

from pathlib import Path

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from libs.lora.format import ADAPTER_FILES


class RegistryRefused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"registry refused ({status}): {detail}")
        self.status = status
        self.detail = detail


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, RegistryRefused) and exc.status >= 500


class RegistryClient:
    def __init__(self, url: str, admin_token: str | None, timeout_s: float = 120.0, retry_for_s: float = 60.0):
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s)
        self.retry_for_s = retry_for_s

    async def close(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_transient),
            reraise=True,
            stop=stop_after_delay(self.retry_for_s),
            wait=wait_exponential(multiplier=0.5, max=5),
        ):
            with attempt:
                reply = await self.http.request(method, path, **kwargs)
                if reply.status_code >= 400:
                    try:
                        detail = reply.json().get("detail", reply.text)
                    except ValueError:
                        detail = reply.text
                    raise RegistryRefused(reply.status_code, str(detail))
                return reply
        raise AssertionError("unreachable")

    async def push(
        self, *, tenant: str, adapter: str, base_model: str, directory: Path, dataset: str, migration_item: int | None
    ) -> dict:
        form = {"tenant": tenant, "adapter": adapter, "base_model": base_model, "dataset": dataset}
        if migration_item is not None:
            form["migration_item"] = str(migration_item)
        files = [("files", (name, (directory / name).read_bytes())) for name in ADAPTER_FILES]
        reply = await self._call("POST", "/v1/adapters", data=form, files=files)
        return reply.json()["version"]

    async def fail_item(self, migration_id: str, item_id: int, reason: str) -> None:
        await self._call("POST", f"/v1/migrations/{migration_id}/items/{item_id}/failed", json={"reason": reason})
