"""Bearer tokens of the read API: HS256-signed JWTs whose subject is the caller's user id.

Claims (RFC 7519): ``sub`` (the user id, a decimal string), ``role`` (``user`` or ``service``),
``aud`` (``recs-api``), ``iss`` (``recs``), ``iat`` and ``exp`` (seconds since the epoch).
``sub``, ``exp``, ``iat``, the audience and the issuer are required, and only HS256 is
accepted, so a token signed with ``alg: none`` or another algorithm is refused (the classic JWT
confusion attacks).

Access rule (issue 3): a ``user`` token may read and dismiss only for its own ``sub``; a
``service`` token may read any user's list, but dismissals are always the user's own act, so
writes need ``sub`` equal to the user in the path whatever the role.

The secret is ``Settings.api_jwt_secret`` (``RECS_API_JWT_SECRET``); no default is shipped and
``recs serve`` / ``recs token`` refuse to start without one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from recs.config import Settings
from recs.contracts import MAX_USER_ID
from recs.errors import (
    AuthenticationError,
    ConfigurationError,
    InvalidRequestError,
    PermissionDeniedError,
    quoted,
)

ALGORITHM = "HS256"
AUDIENCE = "recs-api"
ISSUER = "recs"
ROLES = ("user", "service")
MAX_TTL_SECONDS = 30 * 24 * 3600
"""Longest token lifetime ``mint_token`` (and ``recs token --ttl``) issues: 30 days. An
HS256 token cannot be revoked short of rotating the secret, so its life is bounded."""
ID_RULE = (
    "expected a non-negative integer below 2**63 in plain decimal (no sign, spaces or "
    "leading zeros)"
)


def is_canonical_id(text: str) -> bool:
    """Whether ``text`` is ``0`` or ``[1-9][0-9]*`` (ASCII) and at most ``2**63 - 1``."""
    return (
        0 < len(text) <= 19
        and text.isascii()
        and text.isdigit()
        and (text == "0" or text[0] != "0")
        and int(text) <= MAX_USER_ID
    )


def parse_id(text: str, what: str = "user id") -> int:
    """A user or candidate id given as text (URL path segment, CLI argument, token ``sub``).

    Only the canonical decimal form names an id: ``01``, `` 1``, ``+1``, ``1e3``, ``1.0`` are
    not user 1. Raises ``InvalidRequestError`` (400; CLI exit 2) otherwise."""
    if not is_canonical_id(text):
        raise InvalidRequestError(f"invalid {what} {quoted(text)}: {ID_RULE}")
    return int(text)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's user id and whether it carries the service role."""

    user_id: int
    is_service: bool


def secret_of(settings: Settings) -> str:
    """The signing secret; ``ConfigurationError`` (one line) if ``RECS_API_JWT_SECRET`` is unset."""
    if settings.api_jwt_secret is None:
        raise ConfigurationError(
            "RECS_API_JWT_SECRET is not set: the API signs and checks bearer tokens with it "
            '(at least 32 bytes, e.g. `export RECS_API_JWT_SECRET="$(openssl rand -hex 32)"`)'
        )
    return settings.api_jwt_secret.get_secret_value()


def mint_token(
    secret: str,
    user_id: int,
    *,
    service: bool = False,
    ttl_seconds: int = 3600,
    now: float | None = None,
) -> str:
    """A signed token for ``user_id`` valid ``ttl_seconds`` (1 .. ``MAX_TTL_SECONDS``) from
    ``now`` (epoch seconds, default the wall clock). ``service=True`` adds the service role
    (read any user). Raises ``ValueError`` for an id or a lifetime out of range."""
    if user_id < 0 or user_id > MAX_USER_ID:
        raise ValueError(f"user id out of range: {user_id}")
    if isinstance(ttl_seconds, bool) or not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise ValueError(f"ttl_seconds must be 1 .. {MAX_TTL_SECONDS} (30 days): {ttl_seconds}")
    issued = int(time.time() if now is None else now)
    claims = {
        "sub": str(user_id),
        "role": "service" if service else "user",
        "aud": AUDIENCE,
        "iss": ISSUER,
        "iat": issued,
        "exp": issued + int(ttl_seconds),
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def principal_from_header(secret: str, authorization: str | None) -> Principal:
    """The caller named by an ``Authorization: Bearer <jwt>`` header value.

    Raises ``AuthenticationError`` (401) for a missing header, another scheme, or a token that
    is malformed, not HS256, badly signed, expired, for another audience or issuer, or whose
    ``sub`` is not a user id or ``role`` not a known role. Expiry is checked against the wall
    clock (with no leeway).
    """
    principal, _expires = _verify(secret, _bearer_token(authorization))
    return principal


class VerifiedTokens:
    """``principal_from_header`` with a bounded cache of tokens already verified.

    Verifying an HS256 token costs ~50 µs of Python in PyJWT (base64 alphabet checks, JSON,
    HMAC); a client sends the same token with every request until it expires, so the exact
    token string is cached with its principal and ``exp``. A hit is re-checked against the
    wall clock, so an expired token is refused exactly as without the cache; a token only ever
    enters the cache after full verification with this secret. At most ``max_size`` tokens are
    kept (oldest evicted first).
    """

    def __init__(self, secret: str, max_size: int = 16_384) -> None:
        self._secret = secret
        self._max_size = max_size
        self._cache: dict[str, tuple[Principal, float]] = {}

    def principal(self, authorization: str | None) -> Principal:
        """As ``principal_from_header``."""
        token = _bearer_token(authorization)
        hit = self._cache.get(token)
        if hit is not None:
            principal, expires = hit
            if time.time() < expires:
                return principal
            self._cache.pop(token, None)
            raise AuthenticationError("bearer token has expired")
        principal, expires = _verify(self._secret, token)
        if len(self._cache) >= self._max_size:
            try:
                del self._cache[next(iter(self._cache))]
            except (KeyError, StopIteration, RuntimeError):  # another thread got there first
                pass
        self._cache[token] = (principal, expires)
        return principal


def _bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise AuthenticationError("missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError("malformed Authorization header: expected 'Bearer <token>'")
    return token


def _verify(secret: str, token: str) -> tuple[Principal, float]:
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            audience=AUDIENCE,
            issuer=ISSUER,
            options={"require": ["sub", "exp", "iat", "iss"]},
        )
    except jwt.ExpiredSignatureError:
        raise AuthenticationError("bearer token has expired") from None
    except jwt.InvalidTokenError as error:
        raise AuthenticationError(f"invalid bearer token: {_why(error)}") from None
    subject = claims["sub"]
    if not isinstance(subject, str) or not is_canonical_id(subject):
        raise AuthenticationError(f"invalid bearer token: subject {subject!r} is not a user id")
    role = claims.get("role", "user")
    if role not in ROLES:
        raise AuthenticationError(f"invalid bearer token: unknown role {role!r}")
    return Principal(user_id=int(subject), is_service=role == "service"), float(claims["exp"])


_WHY = (
    # Most specific first: several of PyJWT's classes derive from others.
    (jwt.InvalidSignatureError, "the signature does not verify"),
    (jwt.InvalidAlgorithmError, f"only {ALGORITHM} is accepted"),
    (jwt.InvalidAudienceError, f"the audience must be {AUDIENCE!r}"),
    (jwt.InvalidIssuerError, f"the issuer must be {ISSUER!r}"),
    (jwt.ImmatureSignatureError, "not valid yet"),
    (jwt.InvalidIssuedAtError, "the iat claim is not a time"),
    (jwt.DecodeError, "not a well-formed JWT (header.payload.signature, base64url JSON)"),
)


def _why(error: jwt.InvalidTokenError) -> str:
    """Our own words for why PyJWT refused a token: its messages can quote Python internals
    (a codec's decoding error, a parser's position) that mean nothing to an API client."""
    if isinstance(error, jwt.MissingRequiredClaimError):
        return f"the {error.claim!r} claim is required"
    for kind, reason in _WHY:
        if isinstance(error, kind):
            return reason
    return "refused"


def check_read(principal: Principal, user_id: int) -> None:
    """Raise ``PermissionDeniedError`` (403) unless the caller may read ``user_id``'s list."""
    if principal.is_service or principal.user_id == user_id:
        return
    raise PermissionDeniedError(
        f"token for user {principal.user_id} may not read user {user_id}'s recommendations"
    )


def check_service(principal: Principal, what: str) -> None:
    """Raise ``PermissionDeniedError`` (403) unless the caller has the service role."""
    if principal.is_service:
        return
    raise PermissionDeniedError(f"{what} needs a service token (recs token --service)")


def check_write(principal: Principal, user_id: int) -> None:
    """Raise ``PermissionDeniedError`` (403) unless the caller is ``user_id`` itself."""
    if principal.user_id == user_id:
        return
    raise PermissionDeniedError(
        f"token for user {principal.user_id} may not change user {user_id}'s dismissals"
    )
