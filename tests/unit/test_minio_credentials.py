"""MinIO's root credentials and the metrics token made from them
(aicluster.common.minio_credentials): the token is the JWT ``mc admin prometheus
generate`` prints (HS512, claims exp, iss "prometheus", sub the root user), the same on
every deploy, and the STAND-IN MinIO's own check of a token (tests/e2e/standins/
minio_standin.py, verify_metrics_token: written apart from the minting) takes it, and
refuses it under other credentials.
"""

from __future__ import annotations

import base64
import json
import time

from aicluster.common import minio_credentials as creds
from tests.e2e.standins.minio_standin import verify_metrics_token

USER = "aicluster-admin"
PASSWORD = "stand-in-password-0123"


def _decoded(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_the_token_is_the_jwt_mc_makes_in_its_compact_form():
    token = creds.prometheus_token(USER, PASSWORD)
    header, claims, signature = token.split(".")
    assert "=" not in token, "unpadded base64url, as Go's RawURLEncoding"
    # golang-jwt's header, and StandardClaims' JSON in its field order (exp, iss, sub).
    assert _decoded(header) == b'{"alg":"HS512","typ":"JWT"}'
    assert _decoded(claims) == (
        b'{"exp":4102444800,"iss":"prometheus","sub":"aicluster-admin"}')
    assert len(_decoded(signature)) == 64, "an HMAC-SHA512"
    assert json.loads(_decoded(claims))["exp"] == creds.TOKEN_EXPIRES


def test_the_token_is_the_same_on_every_deploy(tmp_path):
    ref = {"file": str(tmp_path / "minio.secret")}
    first = creds.metrics_token(ref, "minio_root_password", 64, USER)
    assert (tmp_path / "minio.secret").stat().st_size == 64, "generated once"
    assert creds.metrics_token(ref, "minio_root_password", 64, USER) == first
    password = creds.root_password(ref, "minio_root_password", 64)
    assert first == creds.prometheus_token(USER, password)
    assert creds.prometheus_token(USER, PASSWORD) == creds.prometheus_token(USER, PASSWORD)
    assert creds.prometheus_token(USER, PASSWORD) != creds.prometheus_token(USER, "other-pass")


def test_the_stand_in_minio_takes_the_minted_token_and_only_under_its_credentials():
    now = time.time()
    token = creds.prometheus_token(USER, PASSWORD)
    assert verify_metrics_token(token, USER, PASSWORD, now) == ""
    assert verify_metrics_token(token, USER, "another-password", now) == (
        "signature is invalid")
    assert verify_metrics_token(token, "someone-else", PASSWORD, now).startswith(
        "the access key is not the root user")
    expired = creds.prometheus_token(USER, PASSWORD, expires=int(now) - 1)
    assert verify_metrics_token(expired, USER, PASSWORD, now) == "token is expired"


def test_a_text_secret_is_the_password_itself(tmp_path):
    path = tmp_path / "minio.secret"
    path.write_text(PASSWORD + "\n")
    assert creds.root_password({"file": str(path)}, "minio_root_password", 64) == PASSWORD
    assert creds.metrics_token({"file": str(path)}, "minio_root_password", 64, USER) == (
        creds.prometheus_token(USER, PASSWORD))
