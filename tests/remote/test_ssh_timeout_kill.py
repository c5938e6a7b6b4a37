"""The timeout kill of a remote command cannot raise in invoke's timer thread
(``autotune.remote._ssh_connection._Remote``).

Seen in a full test run: a command past its timeout ended as the timer fired, the shell
closed the connection, and fabric's kill (``channel.close()``) raised ``EOFError`` in the
timer thread, which pytest reported as an unhandled thread exception. The race needs a busy
machine to happen, so the channel here is one whose transport is gone.
"""

from __future__ import annotations

import pytest
from fabric.runners import Remote

from autotune.remote._ssh_connection import _fabric_config, _Remote


class _GoneChannel:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.closes = 0

    def close(self) -> None:
        self.closes += 1
        raise self.error


def test_every_connection_runs_commands_with_the_quiet_kill() -> None:
    config = _fabric_config()
    assert config.runners.remote is _Remote
    assert issubclass(_Remote, Remote)
    # The other runners are fabric's own.
    assert config.runners.remote_shell is type(config).global_defaults()["runners"]["remote_shell"]


@pytest.mark.parametrize("error", [EOFError(), OSError("Socket is closed")])
def test_killing_a_gone_channel_raises_nothing(error: Exception) -> None:
    quiet = _Remote.__new__(_Remote)
    quiet.channel = _GoneChannel(error)
    quiet.kill()
    assert quiet.channel.closes == 1  # it did try
    plain = Remote.__new__(Remote)
    plain.channel = _GoneChannel(error)
    with pytest.raises(type(error)):
        plain.kill()
