"""`ctx.usage` / `state.usage.usage_record` (issue 37): a report under a provider's id counts once, each report
without one counts, and counts that cannot be tokens are refused before anything is written."""

from __future__ import annotations

import pytest

from agent_runtime.host.runner import Runtime
from agent_runtime.state.usage import usage_record


def _rows(runtime: Runtime) -> list[tuple[str, int, int]]:
    return [(m, int(i), int(o)) for m, i, o in runtime.conn.execute(
        "SELECT model, input_tokens, output_tokens FROM model_usage ORDER BY id").fetchall()]


def test_a_report_counts_once_per_key_and_every_report_without_one_counts(runtime: Runtime) -> None:
    def report(key: str | None) -> bool:
        return usage_record(runtime.conn, task_id=None, step="think", model="m", input_tokens=5, output_tokens=2,
                            key=key)

    assert report("chatcmpl-1") is True and report("chatcmpl-1") is False
    assert report(None) is True and report(None) is True
    assert _rows(runtime) == [("m", 5, 2)] * 3


@pytest.mark.parametrize("bad", [{"model": ""}, {"model": "x" * 201}, {"input_tokens": -1}, {"output_tokens": 1.5},
                                 {"input_tokens": True}, {"key": ""}])
def test_counts_that_are_not_tokens_are_refused(runtime: Runtime, bad: dict[str, object]) -> None:
    values: dict[str, object] = {"model": "m", "input_tokens": 1, "output_tokens": 1, "key": None, **bad}
    with pytest.raises(ValueError):
        usage_record(runtime.conn, task_id=None, step="s", **values)  # type: ignore[arg-type]
    assert _rows(runtime) == []
