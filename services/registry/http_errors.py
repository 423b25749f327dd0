"""The registry's HTTP errors: one body model for every 4xx/5xx, the handlers that produce it, and the
`responses=` entries that document it in the OpenAPI, so that generated clients know every status a
route can answer and what comes with it.

Every error is `{"error": <code>, "detail": <message for a person>, ...extras}`. Input that storage
cannot hold (a number beyond PostgreSQL's range, a NUL byte, a lone surrogate) is refused with 422
before or when it reaches the database, never answered 500.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import DBAPIError, IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.registry.db import is_unavailable
from services.registry.errors import RegistryError

PG_INT_MAX = 2**31 - 1  # PostgreSQL `integer`: ids, version numbers


class ErrorBody(BaseModel):
    """What every error answer carries."""

    model_config = ConfigDict(extra="allow")
    error: str = Field(description="machine-readable code: not_found, invalid, conflict, unauthorized, ...")
    detail: str = Field(description="what went wrong, for a person")


_DESCRIPTIONS = {
    400: "the request could not be read (malformed JSON or form)",
    401: "no, a wrong, an expired or a revoked credential (or a tenant API key where none is accepted)",
    403: "a valid credential without the right to this: the admin scope needed, or another tenant's",
    404: "no such tenant, adapter, version, alias, dataset or migration",
    409: "conflicts with the current state (a name taken, a transition not allowed)",
    413: "the upload is over the registry's size limit",
    422: "refused input: the field and the rule are named",
    503: "the registry's database or object store is unavailable; retry",
}


def documented(*statuses: int) -> dict[int | str, dict]:
    """`responses=` entries for these statuses, each with ErrorBody."""
    return {status: {"model": ErrorBody, "description": _DESCRIPTIONS[status]} for status in statuses}


def error_response(exc: RegistryError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content={"error": exc.code, "detail": exc.message, **exc.details})


def _body(status: int, code: str, detail: str, **extra) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": code, "detail": detail, **extra})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RegistryError)
    async def registry_error(_: Request, exc: RegistryError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [_problem(e) for e in exc.errors()]
        return _body(422, "invalid", "; ".join(problems[:3]) or "invalid request", errors=problems)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}
        return _body(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(IntegrityError)
    async def integrity_error(_: Request, exc: IntegrityError) -> JSONResponse:
        return _body(409, "conflict", str(getattr(exc, "orig", exc)).splitlines()[0])

    @app.exception_handler(UnicodeError)
    async def unicode_error(_: Request, exc: UnicodeError) -> JSONResponse:
        return _body(422, "invalid", "text must be valid Unicode (no lone surrogates)")

    async def database_error(_: Request, exc: Exception) -> JSONResponse:
        if is_unavailable(exc):
            return _body(503, "unavailable", "registry database unavailable; retry")
        refused = _bad_value(exc)
        if refused is not None:  # the caller's value, not our fault: NUL byte, out of range, bad encoding
            return _body(422, "invalid", f"a value cannot be stored: {str(refused).splitlines()[0]}")
        return _body(500, "internal", type(exc).__name__)

    # Registered per class (not for Exception) so they answer inside the app instead of in the
    # outermost error middleware, which would re-raise after answering.
    for cls in (DBAPIError, OSError):
        app.add_exception_handler(cls, database_error)


def _problem(error: dict) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
    return f"{where}: {error.get('msg', 'invalid')}"


def _bad_value(exc: BaseException) -> BaseException | None:
    """The driver's data error behind a database error (asyncpg's DataError family: a NUL byte, a
    number out of the column's range, text in a wrong encoding), if that is what it is."""
    import asyncpg

    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, asyncpg.exceptions.DataError):
            return current
        stack += [getattr(current, "orig", None), current.__cause__, current.__context__]
    return None
