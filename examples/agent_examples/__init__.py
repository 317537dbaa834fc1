"""Example agents for agent_runtime, installable as the `agent-runtime-examples` distribution.

`demo` and `forward` (`agent_examples.demo`), `support` (`agent_examples.support`), `calendar`
(`agent_examples.connected`); `peers/` holds the local providers the demo and the tests talk to (an SMTP relay, a
Stripe-style payments API, a chat model speaking the OpenAI chat-completions wire format, an OAuth 2.0 server).
"""
