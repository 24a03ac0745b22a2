"""The embedded default's broker: kombu's filesystem transport, each message written whole.

kombu writes a message straight into the queue's folder under its final name, so a worker
polling the folder can take the file before its bytes are in, read nothing and stop on the
empty JSON (``Unrecoverable error: JSONDecodeError``, seen in CI). Here a message is
written under a name no queue reads (it starts with a dot), then renamed into place: a
rename within one folder is atomic, so a reader finds a whole message or none.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from time import monotonic
from typing import Any, cast

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

_dumps = cast(Callable[[Any], str], dumps)  # kombu's JSON, as its own transport writes it


class Channel(filesystem.Channel):
    # kombu's base class names the message ``message``, its filesystem channel ``payload``:
    # no name satisfies both, and kombu passes it by position.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as file:
                file.write(_dumps(payload).encode("utf-8"))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
