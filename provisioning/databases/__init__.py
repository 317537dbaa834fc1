"""The tenants' database servers: the server registry and placement (``servers``), moving a tenant between servers
(``move``), promoting a standby (``failover``), schema archives (``archives``), periodic backups (``backups``) and
the expiry of old archives and the keys only they needed (``archive_expiry``).
"""
