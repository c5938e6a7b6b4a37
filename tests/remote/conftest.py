"""Fixtures of the remote tests: real sshd processes (see ``sshd_hosts`` for what exactly).

* ``sshd_lab`` (session): the :class:`sshd_hosts.SSHLab`: servers ``loopback`` (127.0.0.1,
  free port) and, where namespaces work, ``prefill``/``decode`` (own network namespaces);
  client key, known_hosts, ``host_spec(name, **overrides)``. Skips without root or sshd.
* ``netns_lab`` (session): the same lab, skipping when namespaces are unavailable.
* ``ssh_host_specs`` (session): ``{"loopback"|"prefill"|"decode": HostSpec}``, verified
  against the pre-populated known_hosts.
* ``host_pool`` (function): a :class:`HostPool` over ``ssh_host_specs``, closed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sshd_hosts import SSHLab, acquire_lab, release_lab, skip_reason

from autotune.remote.hosts import HostSpec
from autotune.remote.ssh import HostPool


@pytest.fixture(scope="session")
def sshd_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHLab]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    lab = acquire_lab(tmp_path_factory.mktemp("sshd-lab"))
    try:
        yield lab
    finally:
        release_lab()


@pytest.fixture(scope="session")
def netns_lab(sshd_lab: SSHLab) -> SSHLab:
    if sshd_lab.namespace_error is not None:
        pytest.skip(sshd_lab.namespace_error)
    return sshd_lab


@pytest.fixture(scope="session")
def ssh_host_specs(sshd_lab: SSHLab) -> dict[str, HostSpec]:
    return sshd_lab.host_specs()


@pytest.fixture
def host_pool(ssh_host_specs: dict[str, HostSpec]) -> Iterator[HostPool]:
    with HostPool(ssh_host_specs) as pool:
        yield pool
