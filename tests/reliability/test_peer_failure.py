"""Two processes under initialize_distributed: a peer that dies or never starts is a PeerFailureError
naming it, within the peer timeout (plus the watchdog's 1 s poll), never a C++ abort or a hang."""
from __future__ import annotations

import re

from tests.reliability.conftest import FOUR_DEVICES, free_port, results

TIMEOUT = 4.0  # seconds (the default is 30)


def _job(me, port, scenario, out):
    return {"fn": "peer", "args": {"me": me, "port": port, "scenario": scenario, "timeout": TIMEOUT},
            "out": str(out), "env": FOUR_DEVICES}


def test_a_killed_peer_is_a_python_error_naming_it_within_the_timeout(zygote, tmp_path):
    port = free_port()
    res = zygote.run([_job(0, port, "victim-dies", tmp_path / "p0"), _job(1, port, "victim-dies", tmp_path / "p1")],
                     timeout=90)
    survivor = results(tmp_path / "p0")
    assert res[1]["signal"] == 9, res          # the victim was killed
    assert res[0]["rc"] == 3 and not res[0]["timed_out"], (res, survivor, open(tmp_path / "p0").read()[-3000:])
    m = re.search(r"PeerFailureError missing=\[1\] after=([\d.]+)s", survivor[-1])
    assert m and float(m.group(1)) <= TIMEOUT + 4, survivor  # heartbeat timeout + 1 s poll + slack for a loaded machine
    assert "process(es) 1 of 2 stopped answering" in survivor[-1]
    print(f"\npeer killed: survivor raised PeerFailureError {m.group(1)} s later (peer_timeout {TIMEOUT:g} s)")


def test_a_peer_that_never_starts_is_a_python_error_naming_it(zygote, tmp_path):
    for me, missing in ((0, 1), (1, 0)):  # only this process starts
        res = zygote.run([_job(me, free_port(), "alone", tmp_path / f"alone{me}")], timeout=60)
        got = results(tmp_path / f"alone{me}")
        assert res[0]["rc"] == 3 and not res[0]["timed_out"], (res, open(tmp_path / f"alone{me}").read()[-3000:])
        m = re.search(rf"PeerFailureError missing=\[{missing}\] at=([\d.]+)s", got[-1])
        assert m and float(m.group(1)) <= TIMEOUT + 3, got
        print(f"\nonly process {me} started: PeerFailureError naming process {missing} after {m.group(1)} s "
              f"(init_timeout {TIMEOUT:g} s)")
