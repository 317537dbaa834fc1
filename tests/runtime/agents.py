"""Agents that exist only for tests (loaded with AGENT_APP=tests.runtime.agents:AGENTS): switches such as
"hang in this step" must never be reachable by a task submitter on a real instance."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from agent_examples.demo import DemoAgent

from agent_runtime.sdk import Agent, Context, Step


class HangingDemo(DemoAgent):
    """The demo agent whose step named by the task parameter `hang_step` blocks forever."""

    def steps(self, params: dict[str, Any]) -> list[Step]:
        def hang_or(step: Step) -> Step:
            if params.get("hang_step") != step.name:
                return step

            def hang(ctx: Context) -> Any:
                threading.Event().wait()

            return Step(step.name, hang)

        return [hang_or(s) for s in super().steps(params)]


multi = Agent("multi")


@multi.step
def notify(ctx: Context) -> Any:
    """Sends `emails` emails (a task parameter) in one step; a replay may ask for more than a crash left."""
    return [ctx.effect("email", {"from": "a@t", "to": f"user{i}@t", "subject": f"n{i} {ctx.task_id}",
                                 "body": "hi"})["message_id"] for i in range(int(ctx.params.get("emails", 1)))]


AGENTS = {"demo": HangingDemo(), "multi": multi}


holder = Agent("holder")


@holder.step
def write_then_hold(ctx: Context) -> Any:
    """Writes a file, then keeps working (with progress) while the file named by `hold_file` exists."""
    (ctx.workdir / "partial.txt").write_text(f"attempt at {time.time()}\n")
    while Path(ctx.params["hold_file"]).exists():
        time.sleep(0.05)
        ctx.progress()
    return True


@holder.step
def finish(ctx: Context) -> Any:
    return (ctx.workdir / "partial.txt").read_text().startswith("attempt")


crasher = Agent("crasher")


@crasher.step
def die(ctx: Context) -> Any:
    """A poison step: every attempt kills its own process, as an OOM kill would."""
    os.kill(os.getpid(), signal.SIGKILL)


failer = Agent("failer")


@failer.step(max_attempts=2)
def fail(ctx: Context) -> Any:
    raise RuntimeError("this step always fails")


AGENTS.update({"holder": holder, "crasher": crasher, "failer": failer})


class WorkerWrecked(BaseException):
    """Escapes every `except Exception`: stands for a bug in the runtime that kills the worker thread."""


wrecker = Agent("wrecker")


@wrecker.step
def wreck(ctx: Context) -> Any:
    raise WorkerWrecked("simulated runtime bug")


AGENTS["wrecker"] = wrecker


def _count_summary(previous: Any, messages: list[Any]) -> str:
    folded = (int(previous.content.split()[1]) if previous else 0) + len(messages)
    return f"folded {folded} messages"


chatter = Agent("chatter", summarize=_count_summary)


@chatter.step
def talk(ctx: Context) -> Any:
    """Writes `n` long messages to each of the threads named in `threads`."""
    for thread in ctx.params["threads"]:
        store = ctx.memory.in_thread(thread)
        for i in range(int(ctx.params["n"])):
            store.append("user", f"message {i} of {thread} " + "x" * 60)
    return True


AGENTS["chatter"] = chatter


chat = Agent("chat", description="Echoes the question back, word by word, as a streamed reply.", conversational=True)


@chat.step
def answer(ctx: Context) -> Any:
    """Streams 'echo: <question>' a word at a time (`word_s` apart, from AGENT_CONFIG; the file named by
    `chat_hold_file`, while it exists, holds the step after the first word), then appends the reply once."""
    words = ["echo:", *str(ctx.params["question"]).split()]
    word_s = float(ctx.config.get("word_s", 0))
    hold = ctx.config.get("chat_hold_file")
    for i, word in enumerate(words):
        ctx.stream(("" if i == 0 else " ") + word)
        while i == 0 and hold and Path(str(hold)).exists():
            time.sleep(0.02)
            ctx.progress()
        if word_s:
            time.sleep(word_s)
    seq = ctx.reply(" ".join(words))
    return {"seq": seq, "words": len(words)}


AGENTS["chat"] = chat


# Values the database cannot store as jsonb, by the name a task's `bad` parameter gives.
_UNSTORABLE: dict[str, Any] = {
    "nan": lambda: float("nan"),
    "surrogate": lambda: "\ud800",
    "nul": lambda: {"text": "a\u0000b"},
    "object": lambda: {"items": {1, 2}},
}

unstorable = Agent("unstorable")


@unstorable.step
def prepare(ctx: Context) -> Any:
    return "ready"


@unstorable.step
def emit(ctx: Context) -> Any:
    """Returns the value named by `bad` (with `as_note`: notes it in the case file); without `bad`, a plain one."""
    bad = ctx.params.get("bad")
    value = _UNSTORABLE[bad]() if bad else {"score": 0.5}
    if ctx.params.get("as_note"):
        ctx.note("score", value)
        return True
    return value


AGENTS["unstorable"] = unstorable


# Levers on a stuck task (tests/runtime/test_task_levers.py): a step that fails until its cause is removed (a flag
# file appears), after an effect that must happen once; and steps that need a credential the vault may not hold.
fixable = Agent("fixable")


@fixable.step
def notify_first(ctx: Context) -> Any:
    return ctx.effect("email", {"from": "a@t", "to": "customer@t", "subject": f"refund {ctx.task_id}",
                                "body": "on its way"})["message_id"]


@fixable.step(max_attempts=2)
def charge(ctx: Context) -> Any:
    """Unpacks three values into two until the file named by `fixed_file` exists (the fix)."""
    values = [1, 2] if Path(ctx.params["fixed_file"]).exists() else [1, 2, 3]
    amount, currency = values
    return {"amount": amount, "currency": currency}


@fixable.step
def close(ctx: Context) -> Any:
    return "closed"


keyed = Agent("keyed")


@keyed.step
def ask_model(ctx: Context) -> Any:
    """Reads the credential `openai` (its version only: a value never goes into a result)."""
    return ctx.credential("openai").version


@keyed.step
def pay(ctx: Context) -> Any:
    """An effect whose adapter reads its own credential (`pay` is configured with a bearer credential)."""
    return ctx.effect("pay", {"amount": 5})


AGENTS.update({"fixable": fixable, "keyed": keyed})

needs_key = Agent("needs_key")


@needs_key.step
def read_key(ctx: Context) -> Any:
    """Only reads the credential `openai` (the end-to-end test stores it through the vault API)."""
    return ctx.credential("openai").version


AGENTS["needs_key"] = needs_key


# Thread policies (tests/conversations/test_thread_policies.py): a conversational agent whose run pays when asked,
# then holds while
# the file named by `payer_hold_file` (AGENT_CONFIG, relative to the instance's volume) exists, then answers with the
# user messages its thread's window holds: what a rolled-back run leaves out is visible in the next reply. Its own
# dict (AGENT_APP=tests.runtime.agents:THREAD_AGENTS): a second conversational agent beside `chat` would need
# AGENT_CHAT_KIND everywhere else.
payer = Agent("payer", description="Pays 'pay <cents>', holds, then lists the questions it can see.",
              conversational=True)


@payer.step
def pay_if_asked(ctx: Context) -> Any:
    words = str(ctx.params["question"]).split()
    if words[:1] != ["pay"]:
        return None
    return ctx.effect("payment", {"amount": int(words[1]), "currency": "EUR", "to": "acct_policy"})["id"]


@payer.step
def hold_while_told(ctx: Context) -> Any:
    (ctx.workdir / "draft.txt").write_text(f"thinking about {ctx.params['question']}\n")  # uncommitted work
    hold = ctx.config.get("payer_hold_file")
    while hold and Path(str(hold)).exists():
        time.sleep(0.02)
        ctx.progress()
    return True


@payer.step
def answer_with_window(ctx: Context) -> Any:
    window = ctx.memory.in_thread(ctx.thread).window(4000)
    seen = [m.content for m in window.messages if m.role == "user"]
    return {"seq": ctx.reply("seen: " + " | ".join(seen))}


THREAD_AGENTS = {"payer": payer}


metered = Agent("metered")


@metered.step
def think(ctx: Context) -> Any:
    """Reports a model call under its provider id twice (a cached answer reported again: counted once) and one
    without an id; `n` (a task parameter) scales the first call's tokens."""
    n = int(ctx.params.get("n", 1))
    for _ in range(2):
        ctx.usage(model="m-large", input_tokens=100 * n, output_tokens=10 * n, key=f"cmpl-{ctx.task_id}")
    ctx.usage(model="m-small", input_tokens=7, output_tokens=3)
    time.sleep(0.2)  # a measurable step: compute seconds add up to at least this per task
    return n


@metered.step
def settle(ctx: Context) -> Any:
    """One irreversible effect per task (an email to the test's SMTP sink)."""
    return ctx.effect("email", {"from": "a@t", "to": "u@t", "subject": f"metered {ctx.task_id}", "body": "hi"})


AGENTS["metered"] = metered


# Usage under SIGKILLs (tests/usage/test_usage_chaos.py): two model calls per task, each reported under its own provider
# id; `hold_s` keeps the first step running after its report, the window a SIGKILL lands in so the step runs again
# and reports the same call again. Token counts derive from `n`, so the test knows the exact sums it submitted.
chaos_metered = Agent("chaos-metered")


@chaos_metered.step
def plan(ctx: Context) -> Any:
    n = int(ctx.params["n"])
    ctx.usage(model="m-chaos-large", input_tokens=1000 + n, output_tokens=100 + n, key=f"plan-{ctx.task_id}")
    time.sleep(float(ctx.params.get("hold_s", 0)))
    return n


@chaos_metered.step
def reply(ctx: Context) -> Any:
    n = int(ctx.params["n"])
    ctx.usage(model="m-chaos-small", input_tokens=10 + n, output_tokens=n, key=f"reply-{ctx.task_id}")
    return n


AGENTS["chaos-metered"] = chaos_metered


# Schedules at scale (tests/schedules/test_schedules_hundred.py): the task each fire starts; its one step says which
# schedule asked for it, so the control plane's fire rows and the instance's finished steps can be matched.
tick = Agent("tick")


@tick.step
def tock(ctx: Context) -> Any:
    return {"schedule": ctx.params.get("schedule")}


AGENTS["tick"] = tick


# The egress proxy from inside an isolated instance (tests/provisioning/test_isolation_egress.py): one step fetches
# params["url"] with urllib, which goes through whatever HTTPS_PROXY/HTTP_PROXY the instance was given; an https URL
# is checked against params["cadata"] (the test CA's PEM). One attempt: a refusal fails the task at once.
fetcher = Agent("fetcher")


@fetcher.step(max_attempts=1)
def fetch(ctx: Context) -> Any:
    import ssl
    import urllib.request

    cadata = ctx.params.get("cadata")
    context = ssl.create_default_context(cadata=cadata) if cadata else None
    with urllib.request.urlopen(ctx.params["url"], timeout=10, context=context) as answer:  # noqa: S310
        return {"status": answer.status, "body": answer.read().decode()}


AGENTS["fetcher"] = fetcher
