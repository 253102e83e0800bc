"""The instance's identity from the instance metadata service, IMDSv2 only.

IMDSv2 (AWS EC2 User Guide, "Use the Instance Metadata Service to access instance metadata"): PUT
/latest/api/token with the header X-aws-ec2-metadata-token-ttl-seconds, then GET /latest/meta-data/... with
the header X-aws-ec2-metadata-token. The launch template requires tokens, so IMDSv1 GETs would get 401.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

IMDS_BASE_URL = "http://169.254.169.254"
TOKEN_TTL_S = 21600
TIMEOUT_S = 2.0
ATTEMPTS = 3  # IMDS can be briefly unreachable early in boot


class ImdsError(RuntimeError):
    """The instance metadata service could not be read; the message names the path."""


@dataclass(frozen=True)
class InstanceIdentity:
    instance_id: str
    region: str


class Imds:
    def __init__(self, base_url: str = IMDS_BASE_URL, *, timeout_s: float = TIMEOUT_S,
                 attempts: int = ATTEMPTS, retry_delay_s: float = 1.0) -> None:
        self._base = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._retry_delay_s = retry_delay_s
        self._token: str | None = None
        self._identity: InstanceIdentity | None = None

    def identity(self) -> InstanceIdentity:
        if self._identity is None:
            self._identity = InstanceIdentity(self.get("instance-id"), self.get("placement/region"))
        return self._identity

    def get(self, path: str) -> str:
        """GET /latest/meta-data/<path> with a session token."""
        request = urllib.request.Request(
            f"{self._base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._get_token()}
        )
        return self._send(request, "meta-data/" + path).strip()

    def _get_token(self) -> str:
        if self._token is None:
            request = urllib.request.Request(
                self._base + "/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            self._token = self._send(request, "api/token")
        return self._token

    def _send(self, request: urllib.request.Request, what: str) -> str:
        last: Exception = ImdsError("no attempt")
        for attempt in range(self._attempts):
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                    return response.read().decode("utf-8")
            except urllib.error.HTTPError as e:
                if e.code in (401, 403, 404):
                    raise ImdsError(f"IMDS {what}: HTTP {e.code} {e.reason}") from None
                last = e
            except (urllib.error.URLError, OSError) as e:
                last = e
            if attempt + 1 < self._attempts:
                time.sleep(self._retry_delay_s)
        raise ImdsError(f"IMDS {what} unreachable at {self._base} after {self._attempts} attempts: {last}")
