"""Challenges and credentials: the ``WWW-Authenticate`` header a registry
answers 401 with, and the ``.dockerconfigjson`` a pull secret carries.

Limits: the schemes a registry uses (Basic, Bearer); ``identitytoken``
(OAuth refresh tokens) and credential helpers are not read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["Challenge", "Credentials", "credentials_for", "parse_challenges"]

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_PARAM = re.compile(rf"\s*({_TOKEN})\s*=\s*({_QUOTED}|{_TOKEN})\s*(?:,|$)")
_SCHEME = re.compile(rf"\s*,?\s*({_TOKEN})(?:\s+|$)")
# Docker Hub's registry host is keyed by its index's in every docker config.
_ALIASES = {"registry-1.docker.io": "index.docker.io", "docker.io": "index.docker.io"}


@dataclasses.dataclass(frozen=True)
class Challenge:
    """One challenge: its scheme (lower case) and parameters (names lower case)."""

    scheme: str
    params: Mapping[str, str]


def _unquote(value: str) -> str:
    if value.startswith('"'):
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def parse_challenges(header: str) -> list[Challenge]:
    """Every challenge of a ``WWW-Authenticate`` value (RFC 9110 §11.6.1).

    ValueError for text that is not a challenge list."""
    challenges: list[Challenge] = []
    position = 0
    while position < len(header):
        if not header[position:].strip(" ,"):
            break
        scheme = _SCHEME.match(header, position)
        if scheme is None:
            raise ValueError(f"not an authentication challenge: {header!r}")
        position = scheme.end()
        params: dict[str, str] = {}
        while True:
            param = _PARAM.match(header, position)
            if param is None:
                break
            params[param.group(1).lower()] = _unquote(param.group(2))
            position = param.end()
        challenges.append(Challenge(scheme.group(1).lower(), params))
    if not challenges:
        raise ValueError(f"not an authentication challenge: {header!r}")
    return challenges


@dataclasses.dataclass(frozen=True)
class Credentials:
    username: str
    password: str = dataclasses.field(repr=False)


def _host_of(key: str) -> str:
    """``https://host:5000/v1/`` -> ``host:5000``: docker config keys come
    with and without scheme and path."""
    host = re.sub(r"^[a-z]+://", "", key.strip().lower()).split("/", 1)[0]
    return _ALIASES.get(host, host)


def _entry_credentials(host: str, entry: Mapping[str, Any]) -> Credentials:
    if entry.get("auth"):
        try:
            decoded = base64.b64decode(str(entry["auth"]), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as err:
            raise ValueError(f"auths[{host!r}].auth is not base64 of user:password") from err
        username, colon, password = decoded.partition(":")
        if not colon:
            raise ValueError(f"auths[{host!r}].auth decodes to no user:password pair")
        return Credentials(username, password)
    if "username" in entry or "password" in entry:
        return Credentials(str(entry.get("username", "")), str(entry.get("password", "")))
    raise ValueError(f"auths[{host!r}] has neither auth nor username/password")


def credentials_for(document: bytes | str | Mapping[str, Any], host: str) -> Credentials | None:
    """The credentials a ``.dockerconfigjson`` (or a ``config.json``) holds for
    registry ``host`` (``host[:port]``), or None. ValueError naming the field
    for a document that is not one."""
    if isinstance(document, bytes | str):
        try:
            parsed = json.loads(document)
        except ValueError as err:
            raise ValueError(f".dockerconfigjson is not JSON: {err}") from err
    else:
        parsed = document
    if not isinstance(parsed, Mapping) or not isinstance(parsed.get("auths", {}), Mapping):
        raise ValueError(".dockerconfigjson must be an object with an object `auths`")
    wanted = _host_of(host)
    for key, entry in (parsed.get("auths") or {}).items():
        if _host_of(key) == wanted:
            if not isinstance(entry, Mapping):
                raise ValueError(f"auths[{key!r}] must be an object")
            return _entry_credentials(key, entry)
    return None
