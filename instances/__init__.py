"""What the control plane says to or reads from a tenant's instance, outside the instance API.

``runtime_tables`` is the control plane's one reader of the runtime's own tables in a tenant's schema (boot
records, tasks, steps, effects, the lease): the only module of the control plane that holds SQL naming them,
checked by ``tests/test_runtime_tables_contract.py`` against agent_runtime's migrations. A plain package, not a
Django app: no models, no settings, and it never imports agent code (import-linter).
"""
