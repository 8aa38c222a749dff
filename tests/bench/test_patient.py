"""parts.Patient: the flood is started again while iperf3's server finishes the previous
test, and any other failure is raised at once."""

from __future__ import annotations

from typing import Any

import pytest

from kbp.bench import parts


class FakeFlood:
    def __init__(self, errors: list[str]) -> None:
        self.errors, self.starts = errors, 0

    def start(self) -> None:
        self.starts += 1
        if self.errors:
            raise RuntimeError(f"iperf3 flood exited: {self.errors.pop(0)}")

    def stop(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize("why", ["the server is busy running a test. try again later",
                                 '"error": "unable to receive control message: '
                                 'Connection reset by peer"'])
def test_started_again_while_the_server_finishes(why: str) -> None:
    f = FakeFlood([why, why])
    parts.Patient(f, tries=3, pause=0).start()  # type: ignore[arg-type]
    assert f.starts == 3


def test_other_failures_and_the_last_try_are_raised() -> None:
    f = FakeFlood(["unable to connect to server: Connection refused"])
    with pytest.raises(RuntimeError, match="Connection refused"):
        parts.Patient(f, tries=3, pause=0).start()  # type: ignore[arg-type]
    assert f.starts == 1
    f = FakeFlood(["busy"] * 3)
    with pytest.raises(RuntimeError, match="busy"):
        parts.Patient(f, tries=3, pause=0).start()  # type: ignore[arg-type]
    assert f.starts == 3
