"""Notices to hosts: webhooks sent when an operation changes, signed, at least once.

One module per concern:

- ``models``: endpoints, the events they may subscribe to, and the outbox's messages;
- ``endpoints``: adding, rotating and disabling endpoints; URL and address checks;
- ``outbox``: the rows a change of an operation writes, in that change's transaction
  (registered with the core's ``recovery.changes`` by ``apps.WebhooksConfig``);
- ``send``: one message's signed exchange with its receiver, under a hard deadline;
- ``delivery``: a delivery task: claiming due messages, sending, recording as they come;
- ``outcomes``: what each attempt leaves behind (retries, back-off, an endpoint's
  health, the next message of an operation) and an operator's redelivery;
- ``selectors``: endpoints and deliveries as a console user may see them;
- ``tasks``: the Celery task that delivers, on ``SETTLE_WEBHOOK_QUEUE``.
"""
