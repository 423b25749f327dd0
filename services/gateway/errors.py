"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the right status."""

from __future__ import annotations

from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "timeout",
    409: "conflict",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "timeout",
}


class GatewayError(Exception):
    def __init__(
        self, status: int, message: str, code: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_key() -> GatewayError:
    return GatewayError(401, "Incorrect API key provided.", "invalid_api_key")


def unknown_model(model: str) -> GatewayError:
    # The same body for "no such alias" and "another tenant's adapter": nothing says that it exists.
    return GatewayError(
        404, f"The model '{model}' does not exist or you do not have access to it.", "model_not_found", "model"
    )


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, message, code, param)


def unavailable(message: str, code: str = "service_unavailable") -> GatewayError:
    return GatewayError(503, message, code)


def deadline(seconds: float) -> GatewayError:
    return GatewayError(504, f"The request did not finish within its deadline ({seconds:.1f} s).", "deadline_exceeded")


# A worker's error code -> what the caller gets.
_WORKER_CODES = {
    "deadline": 504,
    "bad_request": 400,
    "base_mismatch": 502,
    "rank_mismatch": 502,
    "digest_mismatch": 502,
    "adapter_unavailable": 503,
    "adapter_invalid": 502,
    "adapter_load_failed": 502,
    "engine_error": 502,
    "result_too_large": 400,
}


def from_worker(code: str, message: str) -> GatewayError:
    status = _WORKER_CODES.get(code, 502)
    if status == 504:
        return GatewayError(504, f"The request did not finish within its deadline: {message}", "deadline_exceeded")
    return GatewayError(status, message, code)
