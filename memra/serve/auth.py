"""Bearer keys for the server: loaded from flags and a file, compared in constant time.

    keys = Keys(load_keys(["k1"], "keys.txt"))
    who = keys.check(request.headers.get("authorization"))   # the key's id, or None

`check` hashes the presented key and compares it with every configured key's hash through
hmac.compare_digest, never stopping early, so the time taken says nothing about which key
or how many characters matched. A key's id (a short hash) names the tenant: the prefix
cache's namespace, never the key itself. `check_bind` refuses a non-loopback address
without keys.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from pathlib import Path

from memra.errors import MemraError
from memra.paths import read_text


def load_keys(keys: list[str] | None, key_file: str | Path | None) -> list[str]:
    """Keys from the flags plus one per non-empty, non-# line of key_file."""
    out = [k.strip() for k in keys or [] if k and k.strip()]
    if key_file:
        p = Path(key_file)
        text = read_text(p, f"--api-key-file {p}")
        out += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if not out:
            raise MemraError(f"--api-key-file {p} holds no key")
    return out


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class Keys:
    def __init__(self, keys: list[str]):
        self._digests = [_digest(k) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> str | None:
        """The id of the key in an `Authorization: Bearer KEY` header, or None (no keys
        configured: "" for everyone)."""
        if not self._digests:
            return ""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        d = _digest(token.strip())
        found = None
        for i, ref in enumerate(self._digests):
            if hmac.compare_digest(d, ref) and found is None:  # every key is compared
                found = i
        return None if found is None else hashlib.sha256(b"memra-key\0" + d).hexdigest()[:16]


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: Keys) -> None:
    """A server reachable from other machines must ask for a key."""
    if not is_loopback(host) and not keys.enabled:
        raise MemraError(f"refusing to listen on {host} without an API key: give --api-key or --api-key-file "
                         f"(or bind 127.0.0.1)")
