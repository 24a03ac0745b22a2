"""Each vote's voter identity (kind and id) from its stored voter, before votes are
unique on it.

A person renamed between two votes on one approval, before this change, has two rows:
both stay, as cast (the approval was decided on them); the later ones keep their whole
stored text as identity, which the old constraint made distinct.
"""

from django.db import migrations

from approvals.actors import Actor


def voter_identity_fill(apps, schema_editor):
    ApprovalVote = apps.get_model("approvals", "ApprovalVote")
    seen = set()
    votes = ApprovalVote.objects.order_by("pk").values_list("pk", "approval_id", "voter")
    for pk, approval_id, voter in votes.iterator():
        actor = voter if isinstance(voter, Actor) else Actor.parse(voter)
        # ``Actor.identity`` as of this migration: kind and id; the stored text for an
        # actor written before ids were kept.
        identity = f"{actor.kind}:{actor.id}" if actor.id else actor.stored
        if (approval_id, identity) in seen:
            identity = actor.stored
        seen.add((approval_id, identity))
        ApprovalVote.objects.filter(pk=pk).update(voter_identity=identity)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0004_approval_proposer_user_approvalvote_voter_identity"),
    ]

    operations = [migrations.RunPython(voter_identity_fill, migrations.RunPython.noop)]
