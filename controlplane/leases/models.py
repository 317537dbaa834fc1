"""The one table of leader leases. Written only through ``lease.LeaderLease`` (raw SQL: one atomic statement)."""

from __future__ import annotations

from django.db import models

__all__ = ["Lease"]


class Lease(models.Model):
    name = models.CharField(max_length=100, primary_key=True)
    #: who holds it: host, pid and a random part (a restarted process with the same pid is someone else)
    holder = models.CharField(max_length=200)
    #: the fencing token: incremented at every change of holder (a renewal keeps it)
    epoch = models.BigIntegerField(default=1)
    #: by the database's clock; past it, anyone may take the lease
    expires_at = models.DateTimeField()
    #: when the current holder took it (the start of this epoch)
    acquired_at = models.DateTimeField()

    class Meta:
        db_table = "controlplane_lease"

    def __str__(self) -> str:
        return f"{self.name}: {self.holder} (epoch {self.epoch}) until {self.expires_at:%H:%M:%S}"
