"""The integration tests' polling helper: what counts as "there yet"."""

from __future__ import annotations

import pytest

from devcluster.testing import eventually


def test_an_empty_answer_is_not_yet_so_the_poll_waits_for_the_first_item() -> None:
    answers = iter([[], [], ["the event"]])
    [event] = eventually(lambda: next(answers), timeout=5, interval=0)
    assert event == "the event"


@pytest.mark.parametrize("nothing", [None, False, [], 0, ""], ids=repr)
def test_a_probe_that_never_answers_fails_at_the_deadline_naming_what_it_waited_for(
    nothing: object,
) -> None:
    with pytest.raises(AssertionError, match="the pod's event"):
        eventually(lambda: nothing, timeout=0.05, interval=0.01, what="the pod's event")
