"""Why a task is blocked, in words, and what clears it: one table from the runtime's reason code to a sentence and
an action, read by the API answers (``blocked_reason_text``, ``blocked_action``), the operator portal and the
staff dashboard, so the three never say different things. No I/O here.

A code the table does not know (an agent's own ``TaskBlocked("...")`` reason) still gets a sentence: the agent
stopped the task itself, and its detail says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BLOCKED_REASONS", "BlockedReason", "blocked_reason_explain", "task_explained"]


@dataclass(frozen=True)
class BlockedReason:
    """`text`: the cause, for a person who did not write the agent; `action`: what clears it (a Retry once the
    cause is fixed, or another lever: a decision, a stored credential, a release)."""

    text: str
    action: str


BLOCKED_REASONS: dict[str, BlockedReason] = {
    "poison_step": BlockedReason(
        "A step failed (or ended its process) every time it was tried, up to the attempt limit.",
        "Read the step's error in the task detail, fix the agent (a new release) or the cause outside it, then "
        "retry: it starts from the last checkpoint."),
    "credential_unavailable": BlockedReason(
        "A step or an effect asked the vault for a credential it does not hold (never stored, or revoked).",
        "Store the credential named in the detail in the customer's vault: the task resumes by itself within a "
        "heartbeat."),
    "connection_needs_reauth": BlockedReason(
        "A step needs the customer's connected account at the provider named in the detail, and that connection "
        "is not usable: the provider refused its refresh, it was disconnected, or it was never connected.",
        "Have the customer connect that account again (the portal's customer page, or your own front end): the "
        "task resumes by itself within a heartbeat."),
    "schedules_unavailable": BlockedReason(
        "A step asked to schedule work (ctx.schedule) and the instance could not reach the control plane that keeps "
        "schedules (an instance run without one, as in the dev loop).",
        "Run the task on an instance the control plane started (its control-plane address is then set), or remove "
        "the ctx.schedule call, then retry: the step replays and schedules once."),
    "effect_in_doubt": BlockedReason(
        "An irreversible effect was attempted and its provider cannot be asked whether it happened.",
        "Decide the effect in the human-decision queue (performed, not performed, or perform now)."),
    "effect_failed": BlockedReason(
        "The provider refused an irreversible effect; the refusal is recorded and will not be retried blind.",
        "Fix what the provider refused (account, payload, limits), then retry."),
    "effect_unconfigured": BlockedReason(
        "A step called an effect that no provider is configured for on this instance.",
        "Configure the effect's adapter for this customer (or ship a release that brings it), then retry."),
    "effect_key_conflict": BlockedReason(
        "A step reused an explicit effect key with different arguments.",
        "Fix the agent so each call has its own key (a new release), then retry."),
    "effect_unrecorded": BlockedReason(
        "A LangGraph step called an effect outside a graph compiled with the runtime's checkpointer.",
        "Compile the graph with the runtime's checkpointer (a new release), then retry."),
    "unknown_kind": BlockedReason(
        "The instance runs no agent of this task's kind.",
        "Roll out a release that has this kind: the task resumes by itself when it loads."),
    "release_unavailable": BlockedReason(
        "The task started on an earlier release, which this instance can no longer load, and a task finishes on "
        "the release it started on unless its agent declares its steps compatible.",
        "Retry to continue it on the release the instance runs now (recorded as a crossing), or roll back to the "
        "release it started on: it then resumes by itself."),
    "rolled_back": BlockedReason(
        "A new message on its thread rolled this run back (thread policy 'rollback') before the step's effect was "
        "performed; the run ended as rolled back and the effect was never sent.",
        "Nothing to clear: the thread continues with the new message's run."),
    "judgment_invalid": BlockedReason(
        "The files a step acts on are no longer the ones a passing judgment (a scan, a review) checked.",
        "Judge the current files again (or restore the judged ones), then retry."),
    "effects_config_invalid": BlockedReason(
        "The task's agent configuration names an effect provider under 'effects' that cannot be built.",
        "Fix the customer's configuration, then submit the task again (a task keeps the configuration it started "
        "with)."),
    "mcp_unconfigured": BlockedReason(
        "A step called an MCP server that is not configured for this customer or instance.",
        "Configure the server (the configuration's 'mcp' key, or AGENT_MCP_SERVERS), then submit the task again "
        "(a task keeps the configuration it started with)."),
    "mcp_config_invalid": BlockedReason(
        "The task's agent configuration names an MCP server under 'mcp' that cannot be used.",
        "Fix the customer's configuration, then submit the task again (a task keeps the configuration it started "
        "with)."),
    "workspace_mismatch": BlockedReason(
        "The task's working files differ from its last checkpoint, and the instance refuses to mix histories.",
        "Restore the files of the checkpoint, or fork from it explicitly, then retry."),
    "workspace_refused": BlockedReason(
        "The task's working files hold an entry no checkpoint can vouch for (a link leaving it, a device).",
        "Remove the entry from the task's workspace (or fix the step that makes it), then retry."),
    "unstorable_result": BlockedReason(
        "A step returned or noted a value the database cannot store.",
        "Fix the step to return plain JSON values (a new release), then retry."),
    "corrupt_state": BlockedReason(
        "A stored row of the task failed its checksum or could not be read.",
        "Restore the tenant's database from backup or ask platform staff; retry once the row reads."),
    "schema_too_new": BlockedReason(
        "The task's state was written by a newer runtime than the one the instance runs.",
        "Upgrade the instance's runtime, then retry."),
    "snapshot_missing": BlockedReason(
        "A workspace snapshot the checkpoint points to is missing from the object store.",
        "Restore the snapshot to the object store or fork the task from an earlier checkpoint, then retry."),
    "restore_refused": BlockedReason(
        "A rollback was refused: the checkpoint no longer matches the files or the effects done since.",
        "Fork from the checkpoint explicitly, or retry from the current state."),
    "checkpoint_missing": BlockedReason(
        "A LangGraph checkpoint the task resumes from is missing.",
        "Restore it, or retry to start the graph from its latest checkpoint."),
    "bad_params": BlockedReason(
        "The task's parameters are not what its agent accepts.",
        "Cancel it and submit a new task with valid parameters."),
    "agent_config": BlockedReason(
        "The agent's configuration lacks something it needs.",
        "Set the missing configuration for this customer, then retry."),
    "model_tool_loop": BlockedReason(
        "The chat model kept asking for tools past the agent's limit of rounds.",
        "Check the model and the tools it was offered (the detail says how many rounds), then retry."),
    "config_missing": BlockedReason(
        "The agent's configuration does not name the credential a step asked it for.",
        "Set that field of the customer's agent configuration to a credential name (the detail names the field), "
        "then retry."),
    "runtime_error": BlockedReason(
        "The runtime met a state it could not act on safely.",
        "Read the detail; fix the cause (or ask platform staff), then retry."),
}

_UNKNOWN = BlockedReason("The agent stopped the task itself; its detail says why.",
                         "Clear the cause the detail names, then retry (or cancel the task).")


def blocked_reason_explain(reason: str | None) -> BlockedReason | None:
    """The words for a reason code; None when the task is not blocked (no code)."""
    if not reason:
        return None
    return BLOCKED_REASONS.get(reason, _UNKNOWN)


def task_explained(task: dict[str, Any]) -> dict[str, Any]:
    """`task` (an instance's task summary) with `blocked_reason_text`, `blocked_action` and `retryable` added."""
    explained = blocked_reason_explain(task.get("blocked_reason")) if task.get("status") == "blocked" else None
    return {**task,
            "blocked_reason_text": explained.text if explained else None,
            "blocked_action": explained.action if explained else None,
            "retryable": task.get("status") in ("blocked", "failed")}
