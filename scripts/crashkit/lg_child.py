"""`python -m crashkit.lg_child SPEC`: run the payment graph in a process of its own, so the kit can SIGKILL it
mid-tool and resume the thread in another one. SPEC (JSON): side (plain | ours), action (start | resume),
thread, dsn, schema, objects_dir, object_key (base64), tenant_id, payments_url, receipt_s. Prints the graph's
last message as one JSON line."""

from __future__ import annotations

import base64
import json
import sys

from crashkit import graphs


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    url = spec["payments_url"]
    if spec["side"] == "plain":
        saver, conn = graphs.plain_saver(spec["dsn"])
        pay = graphs.plain_pay_tool(url, receipt_s=spec["receipt_s"])
    else:
        saver, conn = graphs.our_saver(spec["dsn"], spec["schema"], spec["objects_dir"],
                                       base64.b64decode(spec["object_key"]), spec["tenant_id"], url)
        pay = graphs.durable_pay_tool(receipt_s=spec["receipt_s"])
    graph = graphs.payment_graph(pay, saver)
    cfg = {"configurable": {"thread_id": spec["thread"]}}
    with conn:
        result = graph.invoke(graphs.human("pay acme 42 EUR") if spec["action"] == "start" else None, cfg)
    print(json.dumps({"last": str(result["messages"][-1].content)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
