"""Who may call a serving endpoint: API keys, as OpenAI's and vLLM's servers take them
(`Authorization: Bearer <key>`).

Keys come from a file (one per line; blank lines and `#` comments skipped) named by
`stack.serving_api_keys_file`, and from the environment variable ROSE_SERVING_API_KEY that
`rose up` reads; none configured: the endpoint is open (the local stack binds 127.0.0.1 only).
A presented key is compared with every configured key in constant time, so the time taken says
nothing about which key, or how much of one, matched. Keys are never logged or printed.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path

KEY_ENV = "ROSE_SERVING_API_KEY"
OPEN_BY_DEFAULT = ("/health", "/metrics")  # probes and scrapers; `stack.serving_open_paths`


def load_keys(file: Path | str | None = None, environ: dict | None = None) -> tuple[str, ...]:
    """The configured keys: the file's lines, then the environment's key; a missing or empty
    file is an error naming it (a typo must not leave the endpoint open)."""
    keys = []
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise FileNotFoundError(f"serving API key file {path} does not exist")
        keys = [line.strip() for line in path.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
        if not keys:
            raise ValueError(f"serving API key file {path} holds no key")
    env_key = (environ if environ is not None else os.environ).get(KEY_ENV, "").strip()
    return tuple(keys + ([env_key] if env_key else []))


def presented_key(authorization: str | None) -> str | None:
    """The key in an `Authorization: Bearer <key>` header, or None."""
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


def authorized(authorization: str | None, keys: tuple[str, ...]) -> bool:
    """Whether the header carries one of `keys` (True when no key is configured)."""
    if not keys:
        return True
    key = (presented_key(authorization) or "").encode()
    matched = False
    for k in keys:  # every key compared, whatever matched before
        matched |= hmac.compare_digest(key, k.encode())
    return matched
