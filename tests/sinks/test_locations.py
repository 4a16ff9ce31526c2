"""The one reading of an s3:// URL and of a loopback host."""

from __future__ import annotations

import pytest

from sinks.locations import S3Location, is_loopback_host, is_s3_url


@pytest.mark.parametrize(("url", "bucket", "prefix"), [
    ("s3://lake", "lake", ""),
    ("s3://lake/", "lake", ""),
    ("s3://lake/evagg", "lake", "evagg/"),
    ("s3://lake//evagg/events/", "lake", "evagg/events/"),
])
def test_an_s3_url_is_a_bucket_and_a_prefix_that_ends_in_a_slash(url: str, bucket: str,
                                                                  prefix: str) -> None:
    location = S3Location.parse(url)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert S3Location.parse(location.url) == location


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "/var/lib/evagg", "https://lake/x"])
def test_anything_else_is_refused_with_what_was_expected(url: str) -> None:
    with pytest.raises(ValueError, match=r"expected s3://bucket/prefix/"):
        S3Location.parse(url)


def test_only_the_s3_scheme_is_s3() -> None:
    assert is_s3_url("s3://lake/x")
    assert not is_s3_url("./s3://lake")
    assert not is_s3_url("/data/parquet")


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("LOCALHOST", True), ("agent.localhost", True), ("127.0.0.1", True),
    ("127.8.9.1", True), ("::1", True), ("[::1]", True), ("10.0.0.1", False),
    ("collector.internal", False), ("", False), ("localhost.example.com", False),
])
def test_a_host_is_loopback_only_when_it_cannot_resolve_elsewhere(host: str,
                                                                  loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
