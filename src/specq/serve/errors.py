"""Errors as the OpenAI API returns them: an HTTP status and
`{"error": {"message", "type", "param", "code"}}`, so the official clients raise their usual
exceptions (`openai.BadRequestError`, `openai.NotFoundError`, ...) with a readable message."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import SpecqError

# the `code` of an error raised without one, by HTTP status: a client can always branch on a string
CODES = {400: "invalid_value", 401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed",
         429: "rate_limited", 500: "internal_error", 503: "unavailable", 504: "timeout"}


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = code or CODES.get(status, "invalid_request")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(error: SpecqError) -> APIError:
    """specq's own input checks (prompt, context length, gamma, vocabularies) as a 400."""
    message = str(error)
    code = "context_length_exceeded" if "exceeds the target's context" in message else None
    return APIError(400, message, code=code)


def install(app: FastAPI) -> None:
    """Every error the app can raise answers with the OpenAI error body."""

    @app.exception_handler(APIError)
    async def _api(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(HTTPException)
    # unknown route, wrong method
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return APIError(error.status_code, str(error.detail), type=kind,
                        headers=error.headers).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, error: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(error).__name__}: {error}",
                        type="server_error").response()
