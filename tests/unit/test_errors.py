"""podcert.errors: what every command answers the same way. `one_line` and `show` make what a
command does not control fit one line of a message; `refusal_is_final` turns the API server's
refusal of the credentials (401) or of what they may do (403) into `Refused` once it persists, so
start-up stops retrying and says why; the first few pass, since a binding made just before may not
have reached the authorizer yet. (That each command prints these as one line and exits 2 or 1 is
test_cli_errors.py's.)"""

from __future__ import annotations

import pytest

from podcert.errors import (
    REFUSALS_BEFORE_GIVING_UP,
    CommandError,
    ConfigError,
    Refused,
    one_line,
    refusal_is_final,
    show,
)

# --- one line -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "line"),
    [
        pytest.param("short", 500, "short", id="as it is"),
        pytest.param("  two\n  lines\r\n\tand a tab ", 500, "two lines and a tab", id="flattened"),
        pytest.param("x" * 10, 10, "x" * 10, id="at the limit"),
        pytest.param("x" * 11, 10, "xxxxxxx...", id="over it: cut, the limit kept"),
    ],
)
def test_one_line_flattens_and_cuts_to_the_limit(text: str, limit: int, line: str) -> None:
    assert one_line(text, limit) == line
    assert len(one_line(text, limit)) <= limit


def test_show_quotes_escaping_control_characters_and_cuts_absurd_lengths() -> None:
    assert show("my-signer") == "'my-signer'"
    assert show("a\nb\x1b[31m") == "'a\\nb\\x1b[31m'"
    assert show("y" * 100) == repr("y" * 100)
    assert show("y" * 101) == f"{'y' * 100!r}... (101 characters)"
    assert show("abcdef", limit=3) == "'abc'... (6 characters)"


# --- refusals -------------------------------------------------------------------------------------


class Answer(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"{status} from the API server")
        self.status = status


def test_a_refusal_is_final_only_when_it_persists() -> None:
    """At start-up a 401/403 may be a binding the authorizer has not seen yet: the first few
    pass through to the retry loop, the fourth in a row ends it. Anything else resets the
    count; other errors are never turned into a refusal."""
    answers = iter([403, 403, 503, 401, 401, 401, 401])

    def attempt() -> str:
        raise Answer(next(answers))

    checked = refusal_is_final(attempt, tries=4)
    for expected in (403, 403, 503, 401, 401, 401):
        with pytest.raises(Answer) as caught:
            checked()
        assert caught.value.status == expected
    with pytest.raises(Refused, match=r"credentials are not valid.*401 from the API server"):
        checked()


def test_a_success_between_refusals_starts_the_count_again() -> None:
    outcomes = iter([401, 401, 401, None, 401, 401, 401, 401])

    def attempt() -> str:
        status = next(outcomes)
        if status is not None:
            raise Answer(status)
        return "v1"

    checked = refusal_is_final(attempt)
    for _ in range(REFUSALS_BEFORE_GIVING_UP - 1):
        with pytest.raises(Answer):
            checked()
    assert checked() == "v1"
    for _ in range(REFUSALS_BEFORE_GIVING_UP - 1):
        with pytest.raises(Answer):
            checked()
    with pytest.raises(Refused):
        checked()


def test_a_forbidden_identity_is_told_to_check_its_permissions_in_one_line() -> None:
    def attempt() -> None:
        raise Answer(403)

    checked = refusal_is_final(attempt, tries=1)
    with pytest.raises(Refused) as refused:
        checked()
    message = str(refused.value)
    assert message.startswith("the identity lacks a permission (check its RBAC against manifests/)")
    assert message.endswith(": 403 from the API server")
    assert isinstance(refused.value, CommandError) and not isinstance(refused.value, ConfigError)


def test_a_refusal_whose_message_spans_lines_is_told_in_one() -> None:
    class Multiline(Answer):
        def __str__(self) -> str:
            return "401 Unauthorized:\n  token expired\n"

    def attempt() -> None:
        raise Multiline(401)

    with pytest.raises(Refused) as refused:
        refusal_is_final(attempt, tries=1)()
    assert "\n" not in str(refused.value)
    assert str(refused.value).endswith(": 401 Unauthorized: token expired")


def test_errors_without_a_refusing_status_pass_through_however_many() -> None:
    errors = [ValueError("no status"), Answer(500), Answer(404), Answer(0)] * 3

    def attempt() -> None:
        raise errors.pop(0)

    checked = refusal_is_final(attempt, tries=1)
    while errors:
        expected = type(errors[0])
        with pytest.raises(expected):
            checked()


def test_the_wrapped_attempt_keeps_its_name() -> None:
    def discover() -> str:
        return "v1"

    assert refusal_is_final(discover).__name__ == "discover"
