"""The crash kit: attacks on the runtime (and on the plain LangGraph checkpointer, side by side), each counted
at the real peer it hits. `scripts/crash_kit.py` is the entry point; docs/runtime.md ("Crash kit") the guide.

One module per family of attacks (`payments`, `workspace`, `host_faults`, `langgraph_attacks`), the agents they
run inside agent-host (`agents`), the LangGraph graphs (`graphs`, also run by `lg_child` in its own process),
and `core` (the registry, the tallies, the resources every run cleans up). Nothing here needs pytest.
"""
