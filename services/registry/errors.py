"""Domain errors. Each carries a machine-readable code and a message meant for a person; the HTTP
layer maps the class to a status code, the NATS responder puts code and message in the reply."""

from __future__ import annotations


class RegistryError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, code: str | None = None, details: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}  # machine-readable extras (e.g. the bad line numbers of a dataset)
        if code:
            self.code = code


class NotFound(RegistryError):
    status = 404
    code = "not_found"


class Invalid(RegistryError):
    """Refused input (validation); `code` names the rule that failed."""

    status = 422
    code = "invalid"


class TooLarge(Invalid):
    status = 413
    code = "too_large"


class Conflict(RegistryError):
    status = 409
    code = "conflict"


class Unauthorized(RegistryError):
    status = 401
    code = "unauthorized"


class Unavailable(RegistryError):
    status = 503
    code = "unavailable"


class Forbidden(RegistryError):
    """A valid credential without the right to this action (wrong scope, another tenant)."""

    status = 403
    code = "forbidden"
