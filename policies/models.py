"""Approval policies as applied, and what their budgets have spent.

A policy is a file a team reviews (``policies.policy_file`` reads it); ``manage.py policy
apply`` stores each version here, and the newest row is the one in force. Budgets count
in ``BudgetUse``: one row per approval a budget paid for, locked through its
``BudgetLock`` row so that concurrent openings spend it one at a time.
"""

from __future__ import annotations

from django.db import models

from common.actors import ActorField


class Policy(models.Model):
    """One applied version of the policy file; the newest is in force."""

    version = models.CharField(max_length=71, help_text="sha256: of the file's bytes.")
    source = models.TextField()
    applied_at = models.DateTimeField()
    applied_by = ActorField(blank=False)

    class Meta:
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return self.version


class BudgetLock(models.Model):
    """The row a budget's spending locks, one per budget and scope (a host, an action)."""

    budget = models.CharField(max_length=100)
    scope = models.CharField(max_length=301)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["budget", "scope"], name="budget_lock_once"),
        ]

    def __str__(self) -> str:
        return f"{self.budget} {self.scope}"


class BudgetUse(models.Model):
    """One approval a budget paid for: its amount counts until the window passes it."""

    budget = models.CharField(max_length=100)
    scope = models.CharField(max_length=301)
    approval_id = models.UUIDField()
    amount = models.DecimalField(max_digits=30, decimal_places=8, default=0)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["budget", "scope", "at"], name="budget_use_window")]

    def __str__(self) -> str:
        return f"{self.budget} {self.scope} {self.amount}"
