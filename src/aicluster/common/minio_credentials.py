"""MinIO's root credentials and what is made from them, on the deploying machine: shared
by the minio component (its root password, /etc/default/minio) and the monitoring
component (the bearer token Prometheus reads MinIO's metrics with). Engine-free; a
secret's value is never printed, logged or put in an error.

The root password comes from a secret (aicluster.secrets): the secret itself when it is
a valid MinIO password, else derived from its bytes (the file generated once on the
deploying machine where the inventory names none).

The metrics token is what ``mc admin prometheus generate ALIAS`` prints as
``bearer_token``: a JWT in the compact JWS serialization (RFC 7515 section 7.1: the
base64url, unpadded, header and claims joined by ".", then the signature), signed
HS512 with the root password (MinIO's root secret key), with the claims ``exp``,
``sub`` (the root user, MinIO's root access key) and ``iss`` = "prometheus". Checked
against the sources (2024):

- minio/mc cmd/admin-prometheus-generate.go (generatePrometheusConfig):
  ``jwtgo.NewWithClaims(jwtgo.SigningMethodHS512, jwtgo.StandardClaims{ExpiresAt:
  now + 100 years, Subject: AccessKey, Issuer: "prometheus"})`` signed with
  ``[]byte(SecretKey)``; golang-jwt writes the header ``{"alg":"HS512","typ":"JWT"}``
  and StandardClaims' JSON in the order aud, exp, jti, iat, iss, nbf, sub, empty ones
  left out: ``{"exp":...,"iss":"prometheus","sub":...}``, as :func:`prometheus_token`
  does, so its token is the very one mc prints for that ``exp``;
- minio/minio cmd/metrics.go (AuthMiddleware): the token must pass
  ``metricsRequestAuthenticate`` and ``claims.VerifyIssuer("prometheus", true)``, else
  the request is refused (403, access denied); cmd/jwt.go (metricsRequestAuthenticate):
  the key is the root secret key when the claims' access key is the root access key;
  internal/jwt/parser.go (ParseWithClaims): the access key is the ``accessKey`` claim,
  else ``sub``; the HMAC (HS256/384/512 by the header's ``alg``) over
  ``header.claims`` is compared with the unpadded base64url signature; then the
  claims' ``exp`` must be in the future.

mc's ``exp`` is now + 100 years; ours is fixed (:data:`TOKEN_EXPIRES`, 2100-01-01
00:00:00 UTC), so the same credentials give the same token and a second deploy changes
nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from typing import Any

from aicluster.secrets import password_from_secret
from aicluster.secrets import secret_ref as _secret_ref

#: What MinIO accepts as a root password (secret key): 8 to 40 characters; ours also
#: keeps to characters that need no quoting in /etc/default/minio.
PASSWORD_RE = re.compile(r"^[A-Za-z0-9._~-]{8,40}$")
#: Derives the root password from a secret of random bytes (a generated file).
PASSWORD_CONTEXT = b"aicluster-minio/root-password"
#: The generated secret's file name, under ~/.local/share/aicluster/<cluster_name>/.
SECRET_FILE = "minio.secret"
#: The metrics token's ``exp``: 2100-01-01T00:00:00Z (fixed, so the token is too).
TOKEN_EXPIRES = 4102444800
#: The metrics token's ``iss``: the issuer MinIO's metrics endpoint requires.
TOKEN_ISSUER = "prometheus"


def root_keys_ref(cluster: Any, keys_name: str) -> dict[str, str]:
    """Where the root password's secret is: the inventory's ``secrets.<keys_name>``, else
    a file on the deploying machine, ``~/.local/share/aicluster/<cluster_name>/minio.secret``
    (generated once, the first time it is read)."""
    return _secret_ref(cluster, keys_name, SECRET_FILE)


def root_password(ref: Mapping[str, Any], name: str, size: int, dry: bool = False) -> str:
    """The root password from the secret: the secret itself when it is text (one line)
    of 8-40 letters, digits and ``. _ ~ -``; derived from it when it is random bytes
    (a generated file; not generated in a *dry* run). Raises SecretError naming the
    secret, never its value."""
    return password_from_secret(
        ref, name, size, fits=lambda line: bool(PASSWORD_RE.match(line)),
        what="a MinIO root password (8-40 letters, digits, '.', '_', '~', '-')",
        context=PASSWORD_CONTEXT, length=40, dry=dry)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def prometheus_token(access_key: str, secret_key: str, expires: int = TOKEN_EXPIRES) -> str:
    """The bearer token Prometheus reads MinIO's metrics with (see the module's text):
    a JWT signed HS512 with ``secret_key``, claims ``exp``, ``iss`` = "prometheus",
    ``sub`` = ``access_key``; the same arguments always give the same token."""
    header = _b64url(_json({"alg": "HS512", "typ": "JWT"}))
    claims = _b64url(_json({"exp": int(expires), "iss": TOKEN_ISSUER, "sub": access_key}))
    signing_input = f"{header}.{claims}"
    mac = hmac.new(secret_key.encode("utf-8"), signing_input.encode("ascii"), hashlib.sha512)
    return f"{signing_input}.{_b64url(mac.digest())}"


def metrics_token(ref: Mapping[str, Any], name: str, size: int, user: str,
                  dry: bool = False) -> str:
    """MinIO's metrics token for the root user ``user``, made from the root password the
    secret ``name`` (at ``ref``) gives (:func:`root_password`: generated the first time
    unless *dry*). Raises SecretError naming the secret, never its value."""
    return prometheus_token(str(user), root_password(ref, name, size, dry=dry))
