"""Egress (issue 38, isolation's second wall): the only way out of a tenant's instance to the internet.

An HTTP forward proxy per tenant (``proxy``: CONNECT tunnels and plain-http absolute-form requests, no TLS
interception) that lets a connection through only to a host on the tenant's allow-list (``rules``: the operator's
rules for all its customers, its rules for the release the tenant runs, its rules for this tenant) and only to a
public address (``controlplane.addresses``, checked after DNS, the checked address pinned for the connection).
Every decision is logged per tenant in a bounded table (``EgressDecision``): host, port, bytes, duration, never a
path, query, header or body. ``runner.start_egress_proxy`` is the entry point the sandbox wiring calls;
``manage.py egress_proxy`` runs it as a process. docs/security.md, "Egress".
"""
