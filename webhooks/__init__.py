"""Public events and operator webhooks (issue 17).

Every state change already writes an audit row (``tenants.audit.audit_record``); the changes an operator's
systems care about also become an ``Event`` in the same transaction, and one ``WebhookDelivery`` per
subscribed endpoint. Deliveries are signed, retried with backoff from Celery, and kept (never deleted).
"""
