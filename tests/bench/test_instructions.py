"""Instructions counted by callgrind between a command's marks (bench/instructions.py):
each mark's count is the work done since the one before, and the same on every run."""

from __future__ import annotations

import textwrap
from pathlib import Path

from bench.instructions import run_counted

# Sums 10,000 squares per round, marking after one round and after three.
COMMAND = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from bench.instructions import Marks

    def rounds(count):
        for _ in range(count):
            sum(n * n for n in range(10_000))

    marks = Marks()
    rounds(1)  # before the start: not counted
    marks.start()
    for _ in range(2):
        rounds(1)
        marks.mark("one round")
        rounds(3)
        marks.mark("three rounds")
    """
)


def test_marks_count_the_work_between_them_and_the_same_on_every_run(tmp_path):
    root = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "rounds.py"
    script.write_text(COMMAND.format(root=root))
    first, saved = run_counted([str(script)])
    second, _ = run_counted([str(script)])
    assert saved == {}  # no split was asked for
    assert set(first) == {"one round", "three rounds"}
    one, three = first["one round"], first["three rounds"]
    assert len(one) == len(three) == 2
    # Three rounds are three times one, within what the marks themselves cost.
    assert 2.9 < three[1] / one[1] < 3.1
    assert one[1] > 500_000  # 10,000 squares: hundreds of thousands of instructions
    # The same work counts the same, run after run.
    assert abs(second["three rounds"][1] - three[1]) / three[1] < 0.01
