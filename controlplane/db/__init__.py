"""The control plane's database backend: Django's PostgreSQL backend with a health check that costs no round trip
(``base.DatabaseWrapper.is_usable``)."""
