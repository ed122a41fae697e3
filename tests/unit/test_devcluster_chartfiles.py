"""The chart's generated files are what devcluster/chartfiles.py makes (`make chart` rewrites
them), and its values table says what values.yaml's comments say."""

from __future__ import annotations

import json
import textwrap

import yaml

from devcluster import chartfiles
from devcluster.chartfiles import CHART, Row
from signer.policy import entry_schema


def test_the_checked_in_values_schema_types_the_policy_as_the_policy_reader_does() -> None:
    text = (CHART / "values.schema.json").read_text()
    assert json.loads(text)["properties"]["policy"] == entry_schema(), "run `make chart`"
    assert chartfiles.values_schema(text) == text, "run `make chart`"


def test_the_checked_in_readme_is_the_one_made_from_chart_yaml_and_values_yaml() -> None:
    made = chartfiles.readme(
        (CHART / "Chart.yaml").read_text(), (CHART / "values.yaml").read_text()
    )
    assert (CHART / "README.md").read_text() == made, "run `make chart`"


def test_check_mode_writes_nothing_and_passes_on_the_checked_in_files() -> None:
    assert chartfiles.main(["--check"]) == 0


def test_every_top_level_value_is_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = {row.path for row in chartfiles.rows((CHART / "values.yaml").read_text())}
    assert set(values) <= documented


VALUES = textwrap.dedent(
    """\
    # A preamble, apart from any key.

    # The image.
    image:
      # Where from.
      repository: r.example.com/podcert
      tag: ""
    undocumented: 1
    # Its keys are documented further down.
    monitoring:
      podMonitor:
        # On or off.
        enabled: false
    # A list: its items' keys are its default, not rows.
    peers:
      # Not a row.
      - ipBlock:
          cidr: 10.0.0.0/8
    # Two lines
    # of comment.
    enabled: true
    # Cut off by a blank line.

    replicas: 2
    """
)


def test_a_comment_right_above_a_key_makes_its_row() -> None:
    assert chartfiles.rows(VALUES) == [
        Row("image", None, "The image."),
        Row("image.repository", '"r.example.com/podcert"', "Where from."),
        Row("monitoring", None, "Its keys are documented further down."),
        Row("monitoring.podMonitor.enabled", "false", "On or off."),
        Row(
            "peers",
            '[{"ipBlock": {"cidr": "10.0.0.0/8"}}]',
            "A list: its items' keys are its default, not rows.",
        ),
        Row("enabled", "true", "Two lines of comment."),
    ]


def test_a_pipe_in_a_description_or_default_keeps_its_table_cell() -> None:
    chart = "name: c\ndescription: d\nversion: 1.0.0\nappVersion: '1'\nkubeVersion: '>=1.35'\n"
    made = chartfiles.readme(chart, '# One | two.\nsep: "a|b"\n')
    assert '| `sep` | `"a\\|b"` | One \\| two. |' in made
