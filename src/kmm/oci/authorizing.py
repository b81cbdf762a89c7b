"""Who a client is to one registry, met lazily as the registry's challenges ask.

A request is sent anonymously first; a 401 names the scheme
(:func:`kmm.oci.auth.parse_challenges`). Basic sends the credentials on
every later request; Bearer fetches a token from the challenge's realm for
scope ``repository:<name>:<actions>`` (with the credentials as Basic, when
there are any) and keeps it per repository. Credentials rejected at the
challenge or at the token endpoint are ``CredentialsRejected``; a 401
*after* a token was granted is ``ScopeDenied`` (Docker Hub and GHCR answer
so for a repository that does not exist). A realm on plain HTTP is followed
only when the transport is insecure: a token would cross the network in
the clear.

The exchanges themselves are :mod:`kmm.oci.transport`'s; the request loop
that sends, meets a challenge and sends again is :mod:`kmm.oci.client`'s.
Limits: no redirects followed by token endpoints, no token refresh via
``refresh_token``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence

from yarl import URL

from kmm.oci import auth, errors, transport

__all__ = ["Authorizer"]


class Authorizer:
    """The credentials of one registry, the scheme it asked for and the
    tokens it granted, per repository."""

    def __init__(
        self,
        registry: transport.Transport,
        *,
        credentials: auth.Credentials | None,
        actions: Sequence[str],
    ) -> None:
        self._transport = registry
        self._credentials = credentials
        self._actions = ",".join(actions)
        self._basic = False  # the registry asked for Basic: send it every time
        self._tokens: dict[str, str] = {}  # repository -> bearer token

    def headers(self, name: str) -> dict[str, str]:
        """The ``Authorization`` a request for repository ``name`` carries now."""
        if name in self._tokens:
            return {"Authorization": f"Bearer {self._tokens[name]}"}
        if self._basic:
            return {"Authorization": self._basic_header()}
        return {}

    async def meet(
        self,
        answer: transport.Answer,
        *,
        sent: Mapping[str, str],
        name: str,
        what: str,
        fresh_token: bool,
    ) -> bool:
        """Meet the 401 ``answer`` to a request that carried ``sent``, so the
        next attempt carries what the registry asks for; whether that is a
        token fetched now. ``fresh_token``: the request already carried one
        fetched for it, so a 401 again is the token refused."""
        host = self._transport.host
        code, message = errors.first_error(answer.body)
        if "Bearer" in sent.get("Authorization", ""):
            challenge = self._challenge(answer, what)
            if fresh_token or challenge.params.get("error") == "insufficient_scope":
                raise errors.ScopeDenied(
                    f"{what}: {host} refused the granted token "
                    f"({errors.public_status(answer.status, code)})",
                    detail=f"{challenge.params.get('error', '')} {message}".strip(),
                    status=401,
                    code=code,
                )
            del self._tokens[name]  # expired, perhaps: fetch a new one once
        if sent.get("Authorization", "").startswith("Basic"):
            raise errors.CredentialsRejected(
                f"{what}: {host} refused the credentials of user "
                f"{self._credentials.username if self._credentials else ''!r}",
                detail=message,
                status=401,
                code=code,
            )
        challenge = self._challenge(answer, what)
        if challenge.scheme == "basic":
            if self._credentials is None:
                raise errors.CredentialsRequired(
                    f"{what}: {host} wants credentials and none are configured for it",
                    status=401,
                )
            self._basic = True
            return False
        if challenge.scheme == "bearer":
            self._tokens[name] = await self._token(challenge, name, what)
            return True
        raise errors.UnexpectedResponse(
            f"{what}: {host} asks for an authentication scheme that is not "
            "supported (Basic and Bearer are)",
            detail=challenge.scheme,
            status=401,
        )

    def _basic_header(self) -> str:
        assert self._credentials is not None
        pair = f"{self._credentials.username}:{self._credentials.password}".encode()
        return f"Basic {base64.b64encode(pair).decode()}"

    def _challenge(self, answer: transport.Answer, what: str) -> auth.Challenge:
        header = answer.headers.get("WWW-Authenticate", "")
        try:
            challenges = auth.parse_challenges(header)
        except ValueError as err:
            raise errors.UnexpectedResponse(
                f"{what}: {self._transport.host} answered 401 without a usable challenge",
                detail=str(err),
                status=401,
            ) from err
        for challenge in challenges:
            if challenge.scheme in ("bearer", "basic"):
                return challenge
        return challenges[0]

    async def _token(self, challenge: auth.Challenge, name: str, what: str) -> str:
        host = self._transport.host
        realm = challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise errors.UnexpectedResponse(
                f"{what}: {host}'s Bearer challenge has no usable realm",
                detail=repr(realm),
                status=401,
            )
        if realm.startswith("http://") and not self._transport.insecure:
            raise errors.DestinationRefused(
                f"{what}: {host}'s token endpoint is plain HTTP, which is followed only "
                "for an insecure registry (registryTLS.insecure)",
                detail=realm,
            )
        query = {"scope": f"repository:{name}:{self._actions}"} if name else {}
        if challenge.params.get("service"):
            query["service"] = challenge.params["service"]
        headers = {"Authorization": self._basic_header()} if self._credentials else {}
        where = f"{host}'s token endpoint"
        url = self._transport.via_endpoint(URL(realm).with_query(query))
        answer = await self._transport.send("GET", url, headers, None, what, where=where)
        if answer.status in (401, 403):
            if self._credentials is None:
                raise errors.CredentialsRequired(
                    f"{what}: {where} wants credentials and none are configured for it",
                    status=answer.status,
                )
            raise errors.CredentialsRejected(
                f"{what}: {where} refused the credentials of user "
                f"{self._credentials.username!r} ({answer.status})",
                detail=realm,
                status=answer.status,
            )
        if answer.status != 200:
            code, message = errors.first_error(answer.body)
            raise errors.UnexpectedResponse(
                f"{what}: {where} answered {errors.public_status(answer.status, code)}",
                detail=f"{realm}: {message}",
                status=answer.status,
                code=code,
            )
        try:
            document = json.loads(answer.body)
            token = document.get("token") or document.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise errors.UnexpectedResponse(
                f"{what}: {where} answered without a token", detail=realm, status=200
            )
        return token
