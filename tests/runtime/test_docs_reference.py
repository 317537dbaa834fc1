"""The reference examples of docs/sdk.md (`title="reference/..."` blocks) are loaded and run for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runtime.host.loader import load_agents
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.state import tasks
from tests.docblocks import doc_blocks, write_titled_blocks

from .conftest import ROOT

PAGE = ROOT / "docs" / "sdk.md"


def test_every_block_of_the_sdk_page_is_executed_by_some_test() -> None:
    """Tutorial blocks run in tests/test_docs_sdk.py, reference files here, and `text` blocks are output that
    tests/test_docs_sdk.py compares with what the tutorial printed; nothing else may appear."""
    for block in doc_blocks(PAGE):
        assert block.lang in ("python", "toml", "bash", "text"), block
        if block.lang in ("python", "toml"):
            assert block.title, f"an untitled {block.lang} block would be executed by nobody:\n{block.body[:200]}"


def test_crm_reference_agent_runs_with_its_own_provider(runtime: Runtime, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    write_titled_blocks(doc_blocks(PAGE), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "reference"))
    agent = load_agents("crm_agent:agent").agents["crm-notes"]
    rt = runtime
    tid = tasks.submit(rt.conn, "crm-notes", {"customer": "ada"})
    assert run_task(rt, agent, tid) == "done"
    effects = rt.ledger.for_task(tid)
    assert [(e.effect, e.ordinal, e.explicit_key, e.state) for e in effects] == [
        ("crm_note", 0, None, "committed"), ("crm_note", 1, None, "committed"),
        ("crm_note", 0, "invoice-42-ada", "committed")]
    assert len({e.idem_key for e in effects}) == 3
    # A second task with the same explicit key and the same arguments replays; nothing is performed again.
    adapter = rt.effects_for(agent)["crm_note"]
    before = dict(adapter.notes)
    again = tasks.submit(rt.conn, "crm-notes", {"customer": "ada"})
    assert run_task(rt, agent, again) == "done"
    assert len(adapter.notes) == len(before) + 2  # its two derived-key notes; the invoice note replayed


def test_cache_reference_agent_pays_once_per_kind_scope(runtime: Runtime, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool cache example: the order is this kind's, the VAT rates are shared, a second task pays nothing."""
    write_titled_blocks(doc_blocks(PAGE), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "reference"))
    module = load_agents("cache_agent:refunds")
    agent = module.agents["refunds"]
    import cache_agent  # type: ignore[import-not-found]  # written from the page just above

    rt = runtime
    for _ in range(2):
        tid = tasks.submit(rt.conn, "refunds", {"order": "o-1"})
        assert run_task(rt, agent, tid) == "done"
    assert cache_agent.paid == ["order o-1", "vat"]
    scopes = dict(rt.conn.execute("SELECT tool, scope FROM tool_cache").fetchall())
    assert scopes == {"lookup_order": "kind:refunds", "vat_rates": "shared"}
