"""Defences found by the adversarial review: request body size, strict ids, /metrics access.

World (``api_fixtures``): user 1's list is 20 21 22 23 24; 21 is an active account, so a
dismissal of 21 by user 1 is valid. ``api_max_body_bytes`` defaults to 16,384.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from api_fixtures import NOW, SECRET, bearer, running_server

from recs.config import Settings

WTF = "/v1/users/{}/who-to-follow"
DISMISS = "/v1/users/1/dismissals"
LIMIT = 16 * 1024
TOO_LARGE = f"request body too large: the limit is {LIMIT:,} bytes (api_max_body_bytes)"
CANONICAL = "expected a non-negative integer below 2**63 in plain decimal (no sign, spaces or "
CANONICAL += "leading zeros)"


# --- request body size -----------------------------------------------------------------------
def test_default_body_limit_is_16_kib():
    assert Settings().api_max_body_bytes == LIMIT


def test_declared_oversize_body_is_413_with_the_error_shape(client):
    """A 50 MB body announced by Content-Length: 413 ``{"detail": ...}``, nothing recorded
    (a later read of user 1 still lists 21)."""
    body = b'{"candidate_id": 21, "pad": "' + b"a" * (50 * 1024 * 1024) + b'"}'
    response = client.post(
        DISMISS, content=body, headers={**bearer(1), "Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert response.json() == {"detail": TOO_LARGE}
    items = client.get(WTF.format(1), headers=bearer(1)).json()["items"]
    assert 21 in [item["candidate_id"] for item in items]


def test_a_body_at_the_limit_is_accepted(client):
    """Exactly 16,384 bytes (JSON padded with spaces) is allowed: 201."""
    body = b'{"candidate_id": 21}'
    body += b" " * (LIMIT - len(body))
    assert len(body) == LIMIT
    response = client.post(
        DISMISS, content=body, headers={**bearer(1), "Content-Type": "application/json"}
    )
    assert response.status_code == 201, response.text


def test_chunked_oversize_body_is_413(client):
    """No Content-Length (chunked transfer): the stream is cut off past the limit, 413."""

    def chunks():
        yield b'{"candidate_id": 21, "pad": "'
        for _ in range(64):
            yield b"a" * 1024
        yield b'"}'

    response = client.post(
        DISMISS, content=chunks(), headers={**bearer(1), "Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert response.json() == {"detail": TOO_LARGE}


def _asgi_post(app, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):
    """Drive the ASGI app directly; return (status, body, how many body chunks it pulled)."""
    pulled = 0
    sent: list[dict] = []

    async def receive():
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {
                "type": "http.request",
                "body": chunks[pulled - 1],
                "more_body": pulled < len(chunks),
            }
        await asyncio.sleep(3600)  # never: a disconnect would only come after the response
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": DISMISS, "raw_path": DISMISS.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, pulled


def _auth_header(user: int) -> tuple[bytes, bytes]:
    return (b"authorization", bearer(user)["Authorization"].encode())


def test_oversize_content_length_is_refused_before_reading_any_body(world):
    """Content-Length 50,000,000: the app answers 413 without pulling a single body chunk."""
    from recs.serving.api import create_app

    app = create_app(world.settings, clock=lambda: NOW, watch=False)
    headers = [_auth_header(1), (b"content-type", b"application/json"),
               (b"content-length", b"50000000")]  # fmt: skip
    status, body, pulled = _asgi_post(app, headers, [b"a" * 1024] * 100)
    assert (status, json.loads(body), pulled) == (413, {"detail": TOO_LARGE}, 0)


def test_streamed_body_is_cut_off_at_the_limit(world):
    """100 chunks of 1 KiB, no Content-Length: 413 after pulling at most 17 chunks (the 17th
    takes the total to 17,408 > 16,384 bytes), not all 100."""
    from recs.serving.api import create_app

    app = create_app(world.settings, clock=lambda: NOW, watch=False)
    headers = [_auth_header(1), (b"content-type", b"application/json")]
    status, body, pulled = _asgi_post(app, headers, [b"a" * 1024] * 100)
    assert (status, json.loads(body)) == (413, {"detail": TOO_LARGE})
    assert pulled == 17


def test_a_body_longer_than_its_content_length_is_still_cut_off(world):
    """Content-Length says 20 but the server keeps delivering (a chunked body overriding it):
    still 413 after 17 chunks of 1 KiB."""
    from recs.serving.api import create_app

    app = create_app(world.settings, clock=lambda: NOW, watch=False)
    headers = [_auth_header(1), (b"content-length", b"20")]
    status, body, pulled = _asgi_post(app, headers, [b"a" * 1024] * 100)
    assert (status, json.loads(body), pulled) == (413, {"detail": TOO_LARGE}, 17)


def test_malformed_content_length_is_400(world):
    from recs.serving.api import create_app

    app = create_app(world.settings, clock=lambda: NOW, watch=False)
    headers = [_auth_header(1), (b"content-length", b"12abc")]
    status, body, pulled = _asgi_post(app, headers, [b'{"candidate_id": 21}'])
    assert status == 400
    assert json.loads(body) == {"detail": "invalid Content-Length header '12abc'"}
    assert pulled == 0


def test_body_limit_is_a_setting(world):
    """``api_max_body_bytes=32``: a 33-byte body is 413 naming 32 bytes, 20 bytes pass."""
    from fastapi.testclient import TestClient

    from recs.serving.api import create_app

    settings = world.settings.model_copy(update={"api_max_body_bytes": 32})
    with TestClient(create_app(settings, clock=lambda: NOW, watch=False)) as small:
        headers = {**bearer(1), "Content-Type": "application/json"}
        big = small.post(DISMISS, content=b'{"candidate_id": 21}' + b" " * 13, headers=headers)
        assert big.status_code == 413
        assert big.json()["detail"] == (
            "request body too large: the limit is 32 bytes (api_max_body_bytes)"
        )
        fits = small.post(DISMISS, content=b'{"candidate_id": 21}', headers=headers)
        assert fits.status_code == 201, fits.text


def test_a_real_server_answers_413_without_waiting_for_the_body(world):
    """uvicorn on loopback; the client sends only the headers of a 50 MB POST and waits:
    the 413 arrives at once (the server did not wait to receive 50 MB)."""
    from recs.serving.api import create_app

    app = create_app(world.settings, clock=lambda: NOW, watch=False)
    with running_server(app) as port:
        token = bearer(1)["Authorization"]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                f"POST {DISMISS} HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\n"
                "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n".encode()
            )
            reply = sock.recv(65536).decode()
        assert reply.startswith("HTTP/1.1 413 "), reply
        assert json.dumps({"detail": TOO_LARGE}, separators=(",", ":")) in reply


# --- strict ids --------------------------------------------------------------------------------
@pytest.mark.parametrize("raw", ["01", "00", "%201", "1%20", "+1", "%2B1", "1e3", "1.0", "0x1"])
def test_non_canonical_user_ids_in_paths_are_400(client, raw):
    """Only ``0`` or ``[1-9][0-9]*`` names a user: ``01``, `` 1``, ``1 ``, ``+1``, ``1e3`` are
    not user 1 (the detail quotes the decoded path segment)."""
    from urllib.parse import unquote

    response = client.get(WTF.format(raw), headers=bearer(1, service=True))
    assert response.status_code == 400, response.text
    assert response.json() == {"detail": f"invalid user id {unquote(raw)!r}: {CANONICAL}"}


def test_the_largest_id_is_canonical_and_one_more_is_not(client):
    """2**63-1 parses (unknown user: 404), 2**63 does not (400)."""
    top = client.get(WTF.format(2**63 - 1), headers=bearer(1, service=True))
    assert top.status_code == 404, top.text
    over = client.get(WTF.format(2**63), headers=bearer(1, service=True))
    assert over.status_code == 400
    assert client.get(WTF.format(0), headers=bearer(1, service=True)).status_code == 404


@pytest.mark.parametrize("raw", ["021", "%2021", "21%20", "+21"])
def test_non_canonical_candidate_ids_in_paths_are_400(client, world, raw):
    """User 1 dismissed 21; ``DELETE .../dismissals/021`` must not undo it."""
    from urllib.parse import unquote

    world.dismiss(1, 21)
    response = client.delete(f"{DISMISS}/{raw}", headers=bearer(1))
    assert response.status_code == 400, response.text
    assert response.json() == {"detail": f"invalid candidate id {unquote(raw)!r}: {CANONICAL}"}
    assert client.delete(f"{DISMISS}/21", headers=bearer(1)).status_code == 204


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (b'{"candidate_id": true}', "true"),  # as JSON spells it (a newcomer read "True")
        (b'{"candidate_id": 21.0}', "21.0"),
        (b'{"candidate_id": 2.1e1}', "21.0"),
        (b'{"candidate_id": "21"}', '"21"'),
        (b'{"candidate_id": -0}', "-0"),
        (b'{"candidate_id": null}', "null"),
        (b'{"candidate_id": "' + b"9" * 100 + b'"}', '"' + "9" * 63 + "… (100 characters)"),
        (b'{"candidate_id": "\\ud800"}', '"\\ud800"'),  # a lone surrogate: 400, not 500
        (b'{"candidate_id": "\xe2\x80\xae1"}', '"\\u202e1"'),  # right-to-left override
    ],
)
def test_body_candidate_id_must_be_a_json_integer(client, body, shown):
    response = client.post(
        DISMISS, content=body, headers={**bearer(1), "Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.json() == {
        "detail": f"invalid candidate id {shown}: expected a JSON integer from 0 to 2**63 - 1, "
        "not a string, fraction or boolean"
    }  # (a newcomer's) not the path's rule, "plain decimal": "21" is plain decimal


def test_token_subject_must_be_canonical(client):
    """A correctly signed token with ``sub`` "01" is refused (401), not taken for user 1."""
    import jwt

    now = int(time.time())
    claims = {"sub": "01", "aud": "recs-api", "iss": "recs", "iat": now, "exp": now + 60}
    token = jwt.encode(claims, SECRET, algorithm="HS256")
    response = client.get(WTF.format(1), headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert response.json() == {"detail": "invalid bearer token: subject '01' is not a user id"}


# --- /metrics access --------------------------------------------------------------------------
def test_metrics_need_a_service_token(client):
    """No token 401 (with the Bearer challenge); a user token 403; a service token 200."""
    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    user = client.get("/metrics", headers=bearer(1))
    assert user.status_code == 403
    assert user.json() == {"detail": "/metrics needs a service token (recs token --service)"}
    service = client.get("/metrics", headers=bearer(0, service=True))
    assert service.status_code == 200
    assert "recs_api_request_duration_seconds" in service.text


def test_metrics_can_be_made_public(world):
    from fastapi.testclient import TestClient

    from recs.serving.api import create_app

    settings = world.settings.model_copy(update={"api_metrics_public": True})
    with TestClient(create_app(settings, clock=lambda: NOW, watch=False)) as open_client:
        assert open_client.get("/metrics").status_code == 200


def test_probes_stay_open(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200


def test_metrics_public_defaults_to_false():
    assert Settings().api_metrics_public is False
