"""Where things are in the policy file's text, for the errors that name a line.

tomllib reports no positions for the values it read, so ``policies.policy_file`` finds
the headers and keys of its tables by scanning the text.
"""

from __future__ import annotations

import re


class Lines:
    """The 1-based lines of the rules', the actions' and the providers' headers and keys
    (0: not found, and the error names the table's own line or the whole file)."""

    HEADER = re.compile(r"\s*\[\[\s*rules\s*\]\]")
    ACTION = re.compile(r"\s*\[\[\s*actions\s*\]\]")
    # What ends a table of an array: the next header, other than one of its own tables.
    END = re.compile(r"\s*\[(?!\s*rules\.)")

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.rule_starts = [n for n, line in enumerate(self.lines) if self.HEADER.match(line)]
        self.action_starts = [n for n, line in enumerate(self.lines) if self.ACTION.match(line)]

    def rule(self, index: int) -> int:
        return self.rule_starts[index] + 1 if index < len(self.rule_starts) else 0

    def action(self, index: int) -> int:
        return self.action_starts[index] + 1 if index < len(self.action_starts) else 0

    def _span(self, starts: list[int], index: int) -> range:
        if index >= len(starts):
            return range(0)
        end = next(
            (n for n in range(starts[index] + 1, len(self.lines)) if self.END.match(self.lines[n])),
            len(self.lines),
        )
        return range(starts[index], end)

    def _rule_span(self, index: int) -> range:
        return self._span(self.rule_starts, index)

    def _key_in(self, span: range, key: str) -> int:
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        for n in span:
            if pattern.match(self.lines[n]):
                return n + 1
        return 0

    def key_in_rule(self, index: int, key: str) -> int:
        return self._key_in(self._rule_span(index), key)

    def key_in_action(self, index: int, key: str) -> int:
        return self._key_in(self._span(self.action_starts, index), key)

    def header_in_rule(self, index: int, name: str) -> int:
        pattern = re.compile(rf"\s*\[\s*rules\.{re.escape(name)}\s*\]")
        for n in self._rule_span(index):
            if pattern.match(self.lines[n]):
                return n + 1
        return self.key_in_rule(index, name)

    def key_in_table(self, header: int, key: str) -> int:
        """The line of ``key`` in the table whose header is on line ``header`` (1-based),
        up to the next header; 0 when it is not written there."""
        if not header:
            return 0
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        for n in range(header, len(self.lines)):
            if self.lines[n].lstrip().startswith("["):
                break
            if pattern.match(self.lines[n]):
                return n + 1
        return 0

    def key(self, key: str) -> int:
        pattern = re.compile(rf"\s*(\[+\s*)?{re.escape(key)}\b")
        for n, line in enumerate(self.lines):
            if pattern.match(line):
                return n + 1
        return 0

    def header(self, dotted: str) -> int:
        pattern = re.compile(rf"\s*\[\s*{re.escape(dotted)}\s*\]")
        for n, line in enumerate(self.lines):
            if pattern.match(line):
                return n + 1
        return 0
