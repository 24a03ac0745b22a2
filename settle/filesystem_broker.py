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
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as file:
                file.write(dumps(payload).encode("utf-8"))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
