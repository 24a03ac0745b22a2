"""Messages to people through Apprise: the one way Settle tells someone something.

The operators' alerts (``monitoring.services.alerts``) and the approvers' messages
(``approvals.notices``) both send through it, so it lives in the bottom layer, which every
app may import. Apprise is imported only when a message goes out: loading its plugins is
not free, and only beat's tasks and the admin's URL check need it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def apprise_notify(
    *,
    urls: list[str] | None = None,
    title: str,
    body: str,
    config: str = "",
    tag: str | None = None,
) -> bool:
    """Notify every URL through Apprise; whether all of them took it.

    ``config``: the path of an Apprise configuration file whose URLs are added too;
    ``tag``: only the URLs carrying it are notified (none carries it: not delivered).
    """
    import apprise

    notifier = apprise.Apprise()
    for url in urls or []:
        if not notifier.add(url):
            logger.error("Apprise does not understand one of the URLs it was given")
    if config:
        loaded = apprise.AppriseConfig()
        loaded.add(config)
        notifier.add(loaded)
    if not len(notifier):
        return False
    if tag is None:
        return bool(notifier.notify(title=title, body=body))
    return bool(notifier.notify(title=title, body=body, tag=tag))


def apprise_url_valid(url: str) -> bool:
    """Whether Apprise knows how to send to ``url`` (the admin checks each one)."""
    import apprise

    return bool(apprise.Apprise().add(url))
