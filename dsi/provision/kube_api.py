"""KubeApi: the few Kubernetes API calls a provisioner makes, over aiohttp, with typed errors.

    request(method, path, body) --> 2xx: the JSON body
                                --> 403 KubeForbidden, 404 KubeNotFound, 409 KubeConflict,
                                    other 4xx KubeError                     (never retried)
                                --> 5xx or no connection: retried after 0.2, 0.4, 0.8 s ...
                                    then KubeUnavailable                    (bounded)

Auth is a bearer token. In a pod it is the service account's (`KubeAuth.in_cluster`), re-read
before every request because kubelet rotates it; tests pass an address and a fixed token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(Exception):
    """The API refused a call. `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return self.message


class KubeForbidden(KubeError):
    """403: the service account lacks a permission (see deploy/kubernetes/rbac.yaml)."""


class KubeNotFound(KubeError):
    """404: no such object (a StatefulSet or pod)."""


class KubeConflict(KubeError):
    """409: the object changed since it was read (a stale resourceVersion)."""


class KubeUnavailable(KubeError):
    """5xx or no connection, still so after every retry."""


_BY_STATUS: dict[int, type[KubeError]] = {403: KubeForbidden, 404: KubeNotFound, 409: KubeConflict}


@dataclass(slots=True, frozen=True)
class KubeAuth:
    """How to reach the API server: a base URL and a bearer token (fixed, or from a file).

    ca_file: the CA bundle that signs the server's certificate (None: the system's).
    """

    base_url: str
    token: str = ""
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(
        cls, api_url: str = "", token_file: Path | None = None, ca_file: Path | None = None
    ) -> KubeAuth:
        """The pod's service account: KUBERNETES_SERVICE_HOST/_PORT unless `api_url` is given."""
        if not api_url:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise KubeError(
                    0, "not in a pod: KUBERNETES_SERVICE_HOST/PORT are unset and no api_url is given"
                )
            host = f"[{host}]" if ":" in host else host
            api_url = f"https://{host}:{port}"
        return cls(
            api_url.rstrip("/"),
            token_file=token_file or SERVICE_ACCOUNT / "token",
            ca_file=ca_file if ca_file is not None else _existing(SERVICE_ACCOUNT / "ca.crt"),
        )

    def bearer(self) -> str:
        if self.token_file is None:
            return self.token
        try:
            return self.token_file.read_text().strip()
        except OSError as exc:
            raise KubeError(
                0, f"cannot read the API token {self.token_file}: {exc.strerror or exc}"
            ) from None


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    """`attempts` calls at most; the delay before the n-th retry is `initial_s * 2**(n-1)`, seconds."""

    attempts: int = 4
    initial_s: float = 0.2
    timeout_s: float = 10.0  # one call, connection included


class KubeApi:
    """One HTTP session to one API server; `close()` ends it."""

    def __init__(self, auth: KubeAuth, retry: RetryPolicy | None = None) -> None:
        self.auth = auth
        self.retry = retry or RetryPolicy()
        self._session: aiohttp.ClientSession | None = None

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer of `method path` (`path` starts with /api or /apis)."""
        delay = self.retry.initial_s
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return await self._once(method, path, body)
            except KubeUnavailable as exc:
                if attempt == self.retry.attempts:
                    raise KubeUnavailable(
                        exc.status, f"{exc.message} (gave up after {attempt} attempts)"
                    ) from None
                log.warning("%s %s: %s; retrying in %gs", method, path, exc.message, delay)
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _once(self, method: str, path: str, body: Any) -> Any:
        session = self._open()
        headers = {"Accept": "application/json"}
        if token := self.auth.bearer():
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body)
        try:
            async with session.request(method, self.auth.base_url + path, data=data, headers=headers) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeUnavailable(
                0, f"{method} {path}: no answer from {self.auth.base_url}: {exc!r}"
            ) from None
        if status < 300:
            try:
                return json.loads(text) if text else None
            except ValueError:
                raise KubeError(
                    status, f"{method} {path}: {status} with a body that is not JSON: {text[:200]!r}"
                ) from None
        message = f"{method} {path}: {status} {_reason(text)}"
        if status >= 500:
            raise KubeUnavailable(status, message)
        raise _BY_STATUS.get(status, KubeError)(status, message)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            ctx: ssl.SSLContext | bool = True
            if self.auth.ca_file is not None:
                ctx = ssl.create_default_context(cafile=str(self.auth.ca_file))
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ctx),
                timeout=aiohttp.ClientTimeout(total=self.retry.timeout_s),
            )
        return self._session


def _reason(text: str) -> str:
    """The `message` of a Kubernetes Status answer, else the body's start."""
    try:
        status = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return status["message"]
    return text[:200]


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None
