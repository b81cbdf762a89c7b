"""Challenges and docker-config credentials, as registries and `docker login` write them."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmm.oci import auth


def test_docker_hub_bearer_challenge() -> None:
    header = (
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:library/debian:pull",error="insufficient_scope"'
    )
    [challenge] = auth.parse_challenges(header)
    assert challenge.scheme == "bearer"
    assert challenge.params == {
        "realm": "https://auth.docker.io/token",
        "service": "registry.docker.io",
        "scope": "repository:library/debian:pull",
        "error": "insufficient_scope",
    }


def test_distribution_htpasswd_basic_challenge() -> None:
    assert auth.parse_challenges('Basic realm="kmm-sandbox"') == [
        auth.Challenge("basic", {"realm": "kmm-sandbox"})
    ]


def test_several_challenges_escapes_and_tokens() -> None:
    header = r'Basic realm="a \"quoted\" realm", Bearer realm="https://t/x", service=reg'
    assert auth.parse_challenges(header) == [
        auth.Challenge("basic", {"realm": 'a "quoted" realm'}),
        auth.Challenge("bearer", {"realm": "https://t/x", "service": "reg"}),
    ]


@pytest.mark.parametrize("header", ["", "   ", '="x"', 'Bearer realm="unterminated'])
def test_what_is_not_a_challenge_is_refused(header: str) -> None:
    with pytest.raises(ValueError, match="not an authentication challenge"):
        auth.parse_challenges(header)


_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._", min_size=1, max_size=12)
_value = st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=30)


@given(scheme=_token, params=st.dictionaries(_token, _value, max_size=4))
def test_any_quoted_challenge_parses_back(scheme: str, params: dict[str, str]) -> None:
    quoted = ", ".join(
        f'{name}="{value.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for name, value in params.items()
    )
    header = f"{scheme} {quoted}" if quoted else scheme
    assert auth.parse_challenges(header) == [auth.Challenge(scheme, params)]


def _config(key: str, entry: dict[str, str]) -> str:
    return json.dumps({"auths": {key: entry}})


@pytest.mark.parametrize(
    "key", ["10.253.0.1:5000", "https://10.253.0.1:5000", "https://10.253.0.1:5000/v1/"]
)
def test_credentials_from_auth_under_any_key_form(key: str) -> None:
    encoded = base64.b64encode(b"kmm:s3cr:et").decode()
    found = auth.credentials_for(_config(key, {"auth": encoded}), "10.253.0.1:5000")
    assert found == auth.Credentials("kmm", "s3cr:et")  # only the first colon splits


def test_credentials_from_username_and_password() -> None:
    document = _config("quay.io", {"username": "robot", "password": "pw"})
    assert auth.credentials_for(document, "quay.io") == auth.Credentials("robot", "pw")
    assert auth.credentials_for(document, "quay.io:443") is None
    assert auth.credentials_for(document, "ghcr.io") is None


def test_docker_hub_is_found_under_its_index_key() -> None:
    document = _config("https://index.docker.io/v1/", {"username": "u", "password": "p"})
    assert auth.credentials_for(document, "registry-1.docker.io") == auth.Credentials("u", "p")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("not json", "not JSON"),
        ('{"auths": []}', "object `auths`"),
        (_config("h", {"auth": "!!!"}), r"auths\['h'\].auth is not base64"),
        (_config("h", {"auth": base64.b64encode(b"nocolon").decode()}), "no user:password"),
        (_config("h", {"email": "x"}), "neither auth nor username/password"),
    ],
)
def test_a_broken_document_is_named(document: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        auth.credentials_for(document, "h")


def test_the_password_stays_out_of_repr() -> None:
    assert "hunter2" not in repr(auth.Credentials("u", "hunter2"))
