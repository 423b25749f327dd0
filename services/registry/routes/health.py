"""Liveness and readiness probes (no credentials)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, str] = Field(description="each dependency (database, nats, ...): ok or why not")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "not ready"}})
async def readyz(request: Request) -> JSONResponse:
    ok, checks = await request.app.state.service.ready()
    return JSONResponse(status_code=200 if ok else 503, content={"ready": ok, "checks": checks})
