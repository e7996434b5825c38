"""The endpoint's refusal of a request: an HTTP status and a message naming the field."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the endpoint cannot serve (HTTP 400 unless `status` says otherwise); the message
    names the field."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
