"""The embedded default's broker never shows a worker a message before it is whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from kombu.transport import filesystem

from settle import filesystem_broker


@pytest.fixture
def channel(tmp_path: Path) -> Any:
    folders = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)}
    connection = Connection("filesystem://", transport=filesystem_broker.Transport)
    connection.transport_options = {**folders, "control_folder": str(tmp_path / "control")}
    channel = connection.channel()
    yield channel
    connection.release()


def test_a_worker_polling_while_a_message_is_written_finds_none_then_the_whole_message(
    channel, monkeypatch
):
    seen_mid_write: list[Any] = []
    real_open = open

    def watched_open(path: str, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        file = real_open(path, mode, *args, **kwargs)
        if "w" not in mode:
            return file
        write = file.write

        def write_and_poll(data: bytes) -> int:
            # A worker's poll between the file's creation and its bytes.
            try:
                seen_mid_write.append(channel._get("lookups"))
            except Exception as exc:  # Empty, or kombu's reader failing on the empty file
                seen_mid_write.append(exc)
            return write(data)

        file.write = write_and_poll
        return file

    # Wherever the message is written from: this module or kombu's own.
    for module in (filesystem_broker, filesystem):
        monkeypatch.setattr(module, "open", watched_open, raising=False)
    channel._put("lookups", {"body": "lookup 42"})
    assert [type(found).__name__ for found in seen_mid_write] == ["Empty"]
    assert channel._get("lookups") == {"body": "lookup 42"}
    assert channel._size("lookups") == 0
