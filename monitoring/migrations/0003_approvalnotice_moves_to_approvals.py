from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0002_approvalnotice"),
        ("approvals", "0007_approvalnotice_moves_from_monitoring"),
    ]

    # The table stays (``approvals``' model names it): only Django's idea of which app
    # holds the model moves, so the database is not touched.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name="ApprovalNotice",
                ),
            ],
            database_operations=[],
        ),
    ]
