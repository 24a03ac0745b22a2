import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0006_remove_approvalvote_approval_vote_once_and_more"),
        ("monitoring", "0002_approvalnotice"),
    ]

    # Monitoring's migrations made this table (monitoring_approvalnotice); here the model
    # joins this app's state over it, touching nothing in the database.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ApprovalNotice",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("opened", "Opened"),
                                    ("reminder", "Reminder"),
                                    ("escalation", "Escalation"),
                                    ("expired", "Expired"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("tag", models.CharField(max_length=150)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("pending", "Pending"),
                                    ("sent", "Sent"),
                                    ("dropped", "Dropped"),
                                ],
                                default="pending",
                                max_length=8,
                            ),
                        ),
                        ("created_at", models.DateTimeField()),
                        ("claimed_until", models.DateTimeField(blank=True, null=True)),
                        ("sent_at", models.DateTimeField(blank=True, null=True)),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        ("send_error", models.TextField(blank=True)),
                        (
                            "approval",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="approvals.approval",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "monitoring_approvalnotice",
                        "indexes": [
                            models.Index(
                                condition=models.Q(("status", "pending")),
                                fields=["created_at", "id"],
                                name="approval_notice_pending",
                            )
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("approval", "kind", "tag"), name="approval_notice_once"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
