"""Instances that died, hung or drifted come back on their own: the heartbeat store (``heartbeats``), the sweep that
finds them (``sweep``), the recovery workflow's steps (``steps``), the paths that hear of an exit at once
(``exit_notice``, ``local_exit_watch``, ``pod_watch``), how an instance is doing for the screens (``health``) and
the Prometheus figures (``metrics``).
"""
