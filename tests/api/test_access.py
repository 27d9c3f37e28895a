"""Access control and request errors: every 4xx carries a one-line message.

Rules (``recs.auth``): a user token reads and dismisses only for its own ``sub``; a service
token reads any user but dismisses only for its own ``sub``; no/invalid/expired tokens are
401 with ``WWW-Authenticate: Bearer``.
"""

from __future__ import annotations

import re

import jwt
import pytest
from api_fixtures import SECRET, bearer

WTF = "/v1/users/{}/who-to-follow"


def test_no_token_is_401_with_challenge(client):
    response = client.get(WTF.format(1))
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json() == {
        "detail": "missing bearer token: send 'Authorization: Bearer <token>'"
    }


@pytest.mark.parametrize(
    ("header", "needle"),
    [
        ("Basic dXNlcjpwYXNz", "malformed Authorization header"),
        ("Bearer", "malformed Authorization header"),
        ("Bearer not-a-jwt", "invalid bearer token"),
    ],
)
def test_malformed_authorization_is_401(client, header, needle):
    response = client.get(WTF.format(1), headers={"Authorization": header})
    assert response.status_code == 401
    assert needle in response.json()["detail"]


def test_token_signed_with_another_secret_is_401(client):
    response = client.get(WTF.format(1), headers=bearer(1, secret="x" * 40))
    assert response.status_code == 401
    assert response.json()["detail"] == "invalid bearer token: the signature does not verify"


def test_expired_token_is_401(client):
    """Issued 2 h ago for 1 h: expired an hour ago (PyJWT checks exp against the wall clock)."""
    import time

    headers = bearer(1, ttl_seconds=3600, now=time.time() - 7200)
    response = client.get(WTF.format(1), headers=headers)
    assert response.status_code == 401
    assert response.json()["detail"] == "bearer token has expired"


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_unsigned_or_foreign_algorithm_token_is_401(client):
    """alg=none, and HS512 with the right secret: only HS256 is accepted."""
    import time

    claims = {"sub": "1", "aud": "recs-api", "iss": "recs", "iat": int(time.time()),
              "exp": int(time.time()) + 60}  # fmt: skip
    unsigned = jwt.encode(claims, None, algorithm="none")
    hs512 = jwt.encode(claims, SECRET, algorithm="HS512")  # the right key, a foreign algorithm
    for token in (unsigned, hs512):
        response = client.get(WTF.format(1), headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 401, token


def test_token_for_another_audience_or_without_subject_is_401(client):
    import time

    now = int(time.time())
    base = {"aud": "recs-api", "iss": "recs", "iat": now, "exp": now + 60}
    for claims in (
        {**base, "sub": "1", "aud": "other-api"},
        base,
        {**base, "sub": "alice"},
        {**base, "sub": "1", "role": "admin"},
    ):
        token = jwt.encode(claims, SECRET, algorithm="HS256")
        response = client.get(WTF.format(1), headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 401, claims


def test_reading_another_user_is_403(client):
    response = client.get(WTF.format(3), headers=bearer(1))
    assert response.status_code == 403
    assert response.json()["detail"] == "token for user 1 may not read user 3's recommendations"


def test_service_token_reads_any_user(client):
    response = client.get(WTF.format(3), headers=bearer(999, service=True))
    assert response.status_code == 200
    assert response.json()["user_id"] == 3


def test_dismissing_for_another_user_is_403_even_for_a_service(client):
    for headers in (bearer(3), bearer(3, service=True)):
        response = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=headers)
        assert response.status_code == 403
        delete = client.delete("/v1/users/1/dismissals/21", headers=headers)
        assert delete.status_code == 403
    assert response.json()["detail"] == "token for user 3 may not change user 1's dismissals"


def test_auth_comes_before_validation(client):
    """A malformed id without a token is 401, not 400 (nothing is revealed unauthenticated)."""
    assert client.get(WTF.format("abc")).status_code == 401


BAD_ID = (
    "expected a non-negative integer below 2**63 in plain decimal (no sign, spaces or "
    "leading zeros)"
)
BAD_BODY_ID = "expected a JSON integer from 0 to 2**63 - 1, not a string, fraction or boolean"
BAD_LIMIT = "expected an integer between 1 and 100"
BAD_BODY = 'invalid request body: expected JSON like {"candidate_id": 123}'


@pytest.mark.parametrize(
    ("path", "status", "detail"),
    [
        (WTF.format("abc"), 400, f"invalid user id 'abc': {BAD_ID}"),
        (WTF.format("-1"), 400, f"invalid user id '-1': {BAD_ID}"),
        (WTF.format("9" * 20), 400, f"invalid user id '{'9' * 20}': {BAD_ID}"),
        (WTF.format(1) + "?limit=0", 400, f"invalid limit '0': {BAD_LIMIT}"),
        (WTF.format(1) + "?limit=101", 400, f"invalid limit '101': {BAD_LIMIT}"),
        (WTF.format(1) + "?limit=ten", 400, f"invalid limit 'ten': {BAD_LIMIT}"),
        # canonical, as ids are (a newcomer's: these read 2, or the default)
        (WTF.format(1) + "?limit=", 400, f"invalid limit '': {BAD_LIMIT}"),
        (WTF.format(1) + "?limit=+2", 400, f"invalid limit ' 2': {BAD_LIMIT}"),
        (WTF.format(1) + "?limit=02", 400, f"invalid limit '02': {BAD_LIMIT}"),
        (WTF.format(1) + "?limit=2.0", 400, f"invalid limit '2.0': {BAD_LIMIT}"),
        (WTF.format(1) + "?limit=2&limit=50", 400, "limit given 2 times: give it once"),
        (WTF.format(1) + "?limit=" + "9" * 5000, 400,  # not echoed back whole
         f"invalid limit '{'9' * 63}… (5,000 characters): {BAD_LIMIT}"),
        (WTF.format("7" * 300), 400, f"invalid user id '{'7' * 63}… (300 characters): {BAD_ID}"),
        (WTF.format(777), 404, "unknown user 777: not in the live store"),
        (WTF.format(5), 404, "user 5 is suspended: only active accounts get recommendations"),
    ],
)
def test_bad_requests_are_4xx_with_a_message(client, path, status, detail):
    response = client.get(path, headers=bearer(1, service=True))
    assert response.status_code == status, response.text
    assert response.json() == {"detail": detail}


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        (b"not json", 400, BAD_BODY),
        (b"[21]", 400, BAD_BODY),
        (b"[" * 5000 + b"]" * 5000, 400, BAD_BODY),  # nested past the recursion limit: not a 500
        (b'{"candidate": 21}', 400, BAD_BODY),
        (b'{"candidate_id": "21"}', 400, f'invalid candidate id "21": {BAD_BODY_ID}'),
        (b'{"candidate_id": true}', 400, f"invalid candidate id true: {BAD_BODY_ID}"),
        (b'{"candidate_id": -4}', 400, f"invalid candidate id -4: {BAD_BODY_ID}"),
        (b'{"candidate_id": 1}', 400, "user 1 cannot dismiss itself"),
        (b'{"candidate_id": 777}', 404, "unknown candidate 777: not in the live store"),
    ],
)
def test_bad_dismissals_are_4xx_with_a_message(client, body, status, detail):
    response = client.post(
        "/v1/users/1/dismissals",
        content=body,
        headers={**bearer(1), "Content-Type": "application/json"},
    )
    assert response.status_code == status, response.text
    assert response.json() == {"detail": detail}


def test_delete_with_a_malformed_candidate_is_400(client):
    response = client.delete("/v1/users/1/dismissals/x", headers=bearer(1))
    assert response.status_code == 400
    assert response.json()["detail"].startswith("invalid candidate id 'x'")


def test_token_cli_mints_a_token_the_api_accepts(world, client, monkeypatch, capsys):
    """`recs token 3 --service` prints a token that reads user 1 (service role)."""
    from recs import cli
    from recs.config import get_settings

    monkeypatch.setenv("RECS_API_JWT_SECRET", SECRET)
    get_settings.cache_clear()
    try:
        assert cli.main(["token", "3", "--service"]) == 0
    finally:
        get_settings.cache_clear()
    token = capsys.readouterr().out.strip()
    response = client.get(WTF.format(1), headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200


def test_serve_and_token_refuse_without_a_secret(monkeypatch, capsys):
    from recs import cli
    from recs.config import get_settings

    monkeypatch.delenv("RECS_API_JWT_SECRET", raising=False)
    get_settings.cache_clear()
    try:
        for args in (["token", "1"], ["serve", "--port", "1"]):
            assert cli.main(args) == 2
            lines = capsys.readouterr().err.strip().splitlines()
            assert len(lines) == 1
            assert lines[0].startswith("recs: error: RECS_API_JWT_SECRET is not set")
    finally:
        get_settings.cache_clear()


def test_short_secret_is_rejected_and_never_serialised():
    from pydantic import ValidationError

    from recs.config import Settings

    with pytest.raises(ValidationError, match="at least 32 bytes"):
        Settings(api_jwt_secret="short")
    settings = Settings(api_jwt_secret=SECRET)
    assert "api_jwt_secret" not in settings.model_dump(mode="json")
    assert SECRET not in repr(settings)


def test_a_cached_token_is_refused_once_it_expires(client, monkeypatch):
    """A 60 s token works (and is now cached); 61 s later the same token is 401 although it is
    answered from the cache."""
    import time

    from recs.serving import auth

    issued = time.time()
    headers = bearer(1, ttl_seconds=60, now=issued)
    assert client.get(WTF.format(1), headers=headers).status_code == 200
    monkeypatch.setattr(auth.time, "time", lambda: issued + 61)
    response = client.get(WTF.format(1), headers=headers)
    assert response.status_code == 401
    assert response.json()["detail"] == "bearer token has expired"


def test_the_api_docs_work_offline(client):
    """``/docs`` (Swagger UI) loads its script and style from the server itself, not a CDN, so
    a machine without internet access still shows it (issue 9: it was blank offline)."""
    page = client.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r"""(?:src|href)=["']([^"']+\.(?:js|css))["']""", page.text)
    assert assets and all(asset.startswith("/") for asset in assets), assets
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
