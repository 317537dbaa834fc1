"""Every audit action the control plane writes, as one enum. No I/O here.

``tenants.audit.audit_record`` refuses anything that is not an ``AuditAction`` member, and
``webhooks.events`` maps members (never strings) to public events, so renaming or removing an action breaks
an import or a test instead of silently dropping a webhook event (Zulip's ``AuditLogEventType``).

The values are what ``AuditLog.action`` stores: existing rows, dashboards and the admin filter read them,
so a value never changes; a new action is a new member. ``tests/tenants/test_audit_actions.py`` checks that no
caller passes a string literal and that every value stays unique.
"""

from __future__ import annotations

from django.db import models

__all__ = ["AuditAction"]


class AuditAction(models.TextChoices):
    # Operators and their tokens
    OPERATOR_CREATE = "operator.create"
    OPERATOR_DOMAIN_ADD = "operator.domain.add"
    OPERATOR_TOKEN_ISSUE = "operator_token.issue"
    OPERATOR_TOKEN_REVOKE = "operator_token.revoke"
    # Tenants (tenant.transition carries from/to: every lifecycle move)
    TENANT_ONBOARD = "tenant.onboard"
    TENANT_UPDATE = "tenant.update"
    TENANT_TRANSITION = "tenant.transition"
    # Customer tokens and the operator portal
    CUSTOMER_TOKEN_ISSUE = "customer_token.issue"
    CUSTOMER_TOKEN_REVOKE = "customer_token.revoke"
    CUSTOMER_TOKEN_REFUSED = "customer_token.refused"
    PORTAL_INVITATION_ISSUE = "portal.invitation.issue"
    PORTAL_INVITATION_ACCEPT = "portal.invitation.accept"
    PORTAL_INVITATION_REVOKE = "portal.invitation.revoke"
    PORTAL_MEMBERSHIP_CREATE = "portal.membership.create"
    PORTAL_MEMBERSHIP_REMOVE = "portal.membership.remove"
    # Provisioning workflows (provisioning.services: one per WorkflowKind)
    WORKFLOW_ONBOARD_START = "workflow.onboard.start"
    WORKFLOW_ONBOARD_RETRY = "workflow.onboard.retry"
    WORKFLOW_DEPROVISION_START = "workflow.deprovision.start"
    WORKFLOW_DEPROVISION_RETRY = "workflow.deprovision.retry"
    WORKFLOW_RECOVER_START = "workflow.recover.start"
    WORKFLOW_RECOVER_RETRY = "workflow.recover.retry"
    WORKFLOW_MOVE_START = "workflow.move.start"
    WORKFLOW_MOVE_RETRY = "workflow.move.retry"
    RESOURCE_PROVISION = "resource.provision"
    RESOURCE_DELETE = "resource.delete"
    OBJECTSTORE_CREDENTIALS_RENEW = "objectstore.credentials_renew"
    ARCHIVE_DELETE = "archive.delete"
    # Instances
    INSTANCE_START = "instance.start"
    INSTANCE_STOP = "instance.stop"
    INSTANCE_KILL = "instance.kill"
    INSTANCE_RESTART = "instance.restart"
    INSTANCE_RESTART_REQUESTED = "instance.restart_requested"
    INSTANCE_SLEEP = "instance.sleep"
    INSTANCE_WAKE = "instance.wake"
    INSTANCE_SUBMIT_TASK = "instance.submit_task"
    ROLLING_RESTART_START = "rolling_restart.start"
    # Recovery (one outcome member per terminal RecoveryOutcome)
    INSTANCE_RECOVERY_START = "instance.recovery.start"
    INSTANCE_RECOVERY_SUCCEEDED = "instance.recovery.succeeded"
    INSTANCE_RECOVERY_FAILED = "instance.recovery.failed"
    INSTANCE_RECOVERY_QUARANTINED = "instance.recovery.quarantined"
    # Tenant database servers and moves
    DATABASE_SERVER_ADD = "database_server.add"
    DATABASE_SERVER_UPDATE = "database_server.update"
    DATABASE_SERVER_ACTIVE = "database_server.active"
    DATABASE_SERVER_DRAINING = "database_server.draining"
    DATABASE_SERVER_FAILOVER = "database_server.failover"
    DATABASE_SERVER_FAILOVER_INSTANCES = "database_server.failover_instances"
    DATABASE_MOVE_START = "database.move.start"
    DATABASE_MOVE_SWITCH = "database.move.switch"
    DATABASE_MOVE_FAIL = "database.move.fail"
    # Control-plane services under the supervisor
    SERVICE_RESTART = "service.restart"
    SERVICE_GAVE_UP = "service.gave_up"
    # Vault
    CREDENTIAL_PUT = "credential.put"
    CREDENTIAL_READ = "credential.read"
    CREDENTIAL_REVOKE = "credential.revoke"
    CREDENTIAL_DELIVER = "credential.deliver"
    CREDENTIAL_DESTROY = "credential.destroy"
    CREDENTIAL_DELIVER_REFUSED = "credential.deliver_refused"
    VAULT_OBJECT_KEYS_DELIVER = "vault.object_keys.deliver"
    VAULT_KEK_ROTATION_START = "vault.kek_rotation.start"
    VAULT_KEK_ROTATION_RETRY = "vault.kek_rotation.retry"
    VAULT_KEK_ROTATION_FINISH = "vault.kek_rotation.finish"
    VAULT_DATA_KEY_ROTATION_START = "vault.data_key_rotation.start"
    VAULT_DATA_KEY_ROTATION_RETRY = "vault.data_key_rotation.retry"
    VAULT_DATA_KEY_ROTATION_FINISH = "vault.data_key_rotation.finish"
    VAULT_DATA_KEY_DESTROY = "vault.data_key.destroy"
    SECURITY_CROSS_TENANT_ATTEMPT = "security.cross_tenant_attempt"
    SECURITY_DECRYPTION_FAILED = "security.decryption_failed"
    # Branding
    BRANDING_SUBMIT = "branding.submit"
    BRANDING_PUBLISH = "branding.publish"
    BRANDING_REJECT = "branding.reject"
    BRANDING_ROLLOUT_START = "branding.rollout.start"
    BRANDING_ROLLOUT_FINISH = "branding.rollout.finish"
    # Conversations (the inbox)
    CONVERSATION_MESSAGE_SEND = "conversation.message_send"
    CONVERSATION_THREAD_POLICY_SET = "conversation.thread_policy_set"
    TASK_SUBMIT = "task.submit"
    TASK_CANCEL = "task.cancel"
    TASK_RETRY = "task.retry"
    EFFECT_DECIDE = "effect.decide"
    # Agent releases and rollouts (rollout.<status>: one member per status a staff action moves to)
    RELEASE_CREATE = "release.create"
    RELEASE_DEFAULT = "release.default"
    RELEASE_PIN = "release.pin"
    RELEASE_UNPIN = "release.unpin"
    AGENT_CONFIG_UPDATE = "agent_config.update"
    ROLLOUT_CREATE = "rollout.create"
    ROLLOUT_PAUSED = "rollout.paused"
    ROLLOUT_RUNNING = "rollout.running"
    ROLLOUT_ABORTED = "rollout.aborted"
    ROLLOUT_ROLLING_BACK = "rollout.rolling_back"
    ROLLOUT_GATE_FAILED = "rollout.gate_failed"
    ROLLOUT_FINISH = "rollout.finish"
    # Schedules (a fire itself is audited by the inbox as task.submit / conversation.message_send)
    SCHEDULE_CREATE = "schedule.create"
    SCHEDULE_UPDATE = "schedule.update"
    SCHEDULE_PAUSE = "schedule.pause"
    SCHEDULE_RESUME = "schedule.resume"
    SCHEDULE_DELETE = "schedule.delete"
    # Webhooks
    WEBHOOK_ENDPOINT_CREATE = "webhook_endpoint.create"
    WEBHOOK_ENDPOINT_UPDATE = "webhook_endpoint.update"
    WEBHOOK_ENDPOINT_DELETE = "webhook_endpoint.delete"
    WEBHOOK_ENDPOINT_TEST = "webhook_endpoint.test"
    WEBHOOK_DELIVERY_REPLAY = "webhook_delivery.replay"
    # Model prices (usage.ModelPrice): an operator's own, set in the portal
    MODEL_PRICE_CREATE = "model_price.create"
    MODEL_PRICE_UPDATE = "model_price.update"
    MODEL_PRICE_DELETE = "model_price.delete"
    # Connected accounts (connections app): ids, provider names and statuses only, never a token
    OAUTH_CLIENT_CREATE = "oauth_client.create"
    CONNECTION_START = "connection.start"
    CONNECTION_CREATE = "connection.create"
    CONNECTION_REFUSED = "connection.refused"
    CONNECTION_REFRESH = "connection.refresh"
    CONNECTION_NEEDS_REAUTH = "connection.needs_reauth"
    CONNECTION_DELIVER = "connection.deliver"
    CONNECTION_DELIVER_REFUSED = "connection.deliver_refused"
    CONNECTION_DISCONNECT = "connection.disconnect"
    # Egress allow-lists (egress app): hosts and ports, never what went through
    EGRESS_RULE_CREATE = "egress_rule.create"
    EGRESS_RULE_DELETE = "egress_rule.delete"
    # MCP servers (mcp_servers app): names and URLs, never a token
    MCP_SERVER_CREATE = "mcp_server.create"
    MCP_SERVER_DELETE = "mcp_server.delete"
