"""`file:` header values read again when their file changes, and kept when it cannot be
read or is empty (a writer between truncating and writing)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from sinks.http.header_files import HeaderFiles


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_value(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = tmp_path / "token"
    token.write_text("Bearer one\n")
    headers = {"Authorization": "Bearer one", "X-Source": "evagg"}
    files = HeaderFiles("collector", {"Authorization": str(token)})
    assert not files.refresh(headers)  # the same value: nothing changed
    token.write_text("Bearer two\n")
    os.utime(token, ns=(1, 1))  # a different stamp even within the clock's granularity
    assert files.refresh(headers) and headers["Authorization"] == "Bearer two"
    assert not files.refresh(headers)  # not read again until the file changes

    with caplog.at_level(logging.WARNING, "evagg.sinks.http"):
        token.write_text("")
        assert not files.refresh(headers) and headers["Authorization"] == "Bearer two"
        token.unlink()
        assert not files.refresh(headers) and headers["Authorization"] == "Bearer two"
        (tmp_path / "token").write_bytes(b"\xff\xfe")
        assert not files.refresh(headers) and headers["Authorization"] == "Bearer two"
    assert "is empty" in caplog.text and "Bearer" not in caplog.text
    token.write_text("Bearer three\n")
    assert files.refresh(headers) and headers == {"Authorization": "Bearer three",
                                                 "X-Source": "evagg"}
