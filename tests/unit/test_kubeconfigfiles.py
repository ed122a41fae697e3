"""podcert.client.kubeconfigfiles: what a kubeconfig names is read as client-go reads it and no
further: base64 as Go decodes it, only regular files and only so much of them, the document a
mapping, a token one header-safe line. (Through whole kubeconfigs: test_kubeconfig.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podcert.client.kubeconfigfiles import MAX_FILE_BYTES, decoded, parse, read, token_of
from podcert.client.loadingrules import ClientConfigError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("aGVsbG8=", b"hello", id="padded"),
        pytest.param("aGVs\nbG8=", b"hello", id="a line break, skipped as Go skips it"),
        pytest.param("", None, id="empty: unset"),
    ],
)
def test_base64_fields_decode_as_go_decodes_them(value: str, expected: bytes | None) -> None:
    assert decoded({"k": value}, "k", "cluster 'c'") == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("aGVsbG8", id="padding missing"),
        pytest.param("aGVsbA===", id="too much padding"),
        pytest.param("aGVs bG8=", id="a space"),
    ],
)
def test_base64_go_refuses_is_refused_naming_the_field(value: str) -> None:
    with pytest.raises(ClientConfigError, match="cluster 'c': k is not valid base64"):
        decoded({"k": value}, "k", "cluster 'c'")


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ClientConfigError, match=r"token .*fifo: not a regular file"):
        read(fifo, "token")
    big = tmp_path / "big"
    big.write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ClientConfigError, match="larger than 4 MiB"):
        read(big, "certificate-authority")
    with pytest.raises(ClientConfigError, match="no such file"):
        read(tmp_path / "absent", "tokenFile")


def test_a_kubeconfig_is_a_mapping_and_an_empty_one_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text("")
    assert parse(path) == {}
    path.write_text("- a list\n")
    with pytest.raises(ClientConfigError, match="not a kubeconfig"):
        parse(path)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(b"  \n", "is empty", id="blank"),
        pytest.param(b"a\r\nInjected: 1", "not one line", id="two lines"),
        pytest.param("é".encode(), "not ASCII", id="not ASCII"),
    ],
)
def test_a_token_is_one_header_safe_line(data: bytes, says: str) -> None:
    assert token_of(b" tok-1\n", "tokenFile t") == "tok-1"
    with pytest.raises(ClientConfigError, match=says):
        token_of(data, "tokenFile t")
