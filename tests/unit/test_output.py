"""What every read command prints for programs: one JSON or YAML document whose first keys are
apiVersion and kind, the same document in both formats."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from podcert.output import API_VERSION, FORMATS, add_output_flag, document, dumps, render


def test_a_document_starts_with_its_api_version_and_kind() -> None:
    doc = document("Status", {"healthy": True})

    assert list(doc)[:2] == ["apiVersion", "kind"]
    assert (doc["apiVersion"], doc["kind"]) == (API_VERSION, "Status")


def test_json_and_yaml_carry_the_same_document_in_its_order() -> None:
    doc = document("Status", {"b": [1, None], "a": {"t": "2026-12-05T12:00:00Z"}})

    assert json.loads(dumps(doc, "json")) == doc
    assert yaml.safe_load(dumps(doc, "yaml")) == doc
    assert dumps(doc, "yaml").startswith(f"apiVersion: {API_VERSION}\nkind: Status\nb:")


def test_a_table_is_printed_only_when_asked_for() -> None:
    def table() -> str:
        raise AssertionError("a table was built for a program")

    assert render(document("X", {}), "json", table).endswith("\n")
    assert render(document("X", {}), "table", lambda: "t") == "t\n"


def test_every_read_command_takes_the_same_three_formats() -> None:
    parser = argparse.ArgumentParser()
    add_output_flag(parser)

    assert FORMATS == ("table", "json", "yaml")
    assert parser.parse_args(["-o", "yaml"]).output == "yaml"
    assert parser.parse_args([]).output == "table"
    with pytest.raises(SystemExit):
        parser.parse_args(["-o", "wide"])
