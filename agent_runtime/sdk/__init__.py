"""The agent SDK: the one import an agent author needs.

    from agent_runtime.sdk import Agent, Context

    agent = Agent("hello")

    @agent.step
    def greet(ctx: Context) -> dict:
        return {"greeting": f"hello {ctx.params['name']}"}

Declare the agent in your package's entry points (group `agent_runtime.agents`) and `agent-host` runs it
in every tenant's instance that installs the package. docs/sdk.md is the tutorial and the reference.
"""

from agent_runtime.effects.base import EffectAdapter, LookupResult, ProviderRejected, ProviderUnreachable
from agent_runtime.effects.http import HttpIdempotentEffect
from agent_runtime.effects.smtp import SmtpEffect
from agent_runtime.effects.webhook import WebhookEffect, verify_webhook
from agent_runtime.errors import (
    ConnectionUnavailable,
    CredentialUnavailable,
    EffectFailed,
    EffectKeyConflict,
    JudgmentInvalid,
    TaskBlocked,
)
from agent_runtime.host.credentials import Credential
from agent_runtime.integrations.openai_chat import ChatModel
from agent_runtime.sdk.agent import Agent, AgentDefinition, Step
from agent_runtime.sdk.context import Context
from agent_runtime.state.judgments import Judgment

__all__ = [
    "Agent", "AgentDefinition", "ChatModel", "ConnectionUnavailable", "Context", "Credential",
    "CredentialUnavailable", "EffectAdapter",
    "EffectFailed", "EffectKeyConflict", "HttpIdempotentEffect", "Judgment", "JudgmentInvalid", "LookupResult",
    "ProviderRejected", "ProviderUnreachable", "SmtpEffect", "Step", "TaskBlocked", "WebhookEffect",
    "verify_webhook",
]
