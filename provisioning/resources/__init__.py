"""What a tenant's resources are: the resource-kind table, the tenant's spec, what the features contribute to an
instance, its S3 session credentials, and the one reader of the runtime's own tables in the tenant's schema.

The floor of provisioning: the other subpackages build on these; these import only ``provisioning.models``,
``provisioning.choices`` and the drivers. How a resource is created, repaired and removed is the drivers'
(``provisioning.drivers``) and the workflows' (``provisioning.workflows``).
"""
