"""Two processes under initialize_distributed: a peer that dies or never starts is a PeerFailureError
naming it, within the peer timeout (plus the watchdog's 1 s poll), never a C++ abort or a hang."""
from __future__ import annotations

import re
import time

import pytest

from tests.reliability.conftest import FOUR_DEVICES, free_port, results

TIMEOUT = 4.0  # seconds (the default is 30)


def _job(me, port, scenario, out, service_process="1"):
    return {"fn": "peer", "args": {"me": me, "port": port, "scenario": scenario, "timeout": TIMEOUT},
            "out": str(out), "env": dict(FOUR_DEVICES, XLA_DTENSOR_SERVICE_PROCESS=service_process)}


@pytest.mark.parametrize("service_process", ["1", "0"])
def test_a_killed_peer_is_a_python_error_naming_it_within_the_timeout(zygote, tmp_path, service_process):
    port = free_port()
    res = zygote.run([_job(0, port, "victim-dies", tmp_path / "p0", service_process),
                      _job(1, port, "victim-dies", tmp_path / "p1", service_process)], timeout=90)
    survivor = results(tmp_path / "p0")
    assert res[1]["signal"] == 9, res          # the victim was killed
    assert res[0]["rc"] == 3 and not res[0]["timed_out"], (res, survivor, open(tmp_path / "p0").read()[-3000:])
    m = re.search(r"PeerFailureError missing=\[1\] after=([\d.]+)s", survivor[-1])
    assert m and float(m.group(1)) <= TIMEOUT + 4, survivor  # heartbeat timeout + 1 s poll + slack for a loaded machine
    assert "process(es) 1 of 2 stopped answering" in survivor[-1]
    helper = re.search(r"service helper pid=(\d+)", open(tmp_path / "p0").read())
    assert bool(helper) == (service_process == "1")  # XLA_DTENSOR_SERVICE_PROCESS=0: the service in process 0
    assert helper is None or _ended_within(int(helper.group(1)), 10.0), f"helper {helper.group(1)} still running"
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


def test_a_killed_process_0_is_a_python_error_on_the_survivor_not_an_abort(zygote, tmp_path):
    """Issue 41, item 4: process 0 started the job's coordination service (in a helper process); its death
    is a PeerFailureError on the survivor like any other peer's (before: SIGABRT and a C++ stack ~1 s later),
    and the helper ends once both processes have."""
    port = free_port()
    res = zygote.run([_job(0, port, "root-dies", tmp_path / "p0"), _job(1, port, "root-dies", tmp_path / "p1")],
                     timeout=90)
    survivor = results(tmp_path / "p1")
    log = open(tmp_path / "p1").read()
    assert res[0]["signal"] == 9, res          # process 0 was killed
    assert res[1]["rc"] == 3 and res[1]["signal"] is None and not res[1]["timed_out"], (res, survivor, log[-3000:])
    assert "Terminating process" not in log and "Check failure stack trace" not in log
    m = re.search(r"PeerFailureError missing=\[0\] after=([\d.]+)s", survivor[-1])
    assert m and float(m.group(1)) <= TIMEOUT + 4, survivor
    assert "process(es) 0 of 2 stopped answering" in survivor[-1]
    helper = int(re.search(r"service helper pid=(\d+)", open(tmp_path / "p0").read()).group(1))
    assert _ended_within(helper, 10.0), f"coordination service helper {helper} still running"
    print(f"\nprocess 0 killed: survivor raised PeerFailureError {m.group(1)} s later (peer_timeout {TIMEOUT:g} s)")


def _ended_within(pid: int, seconds: float) -> bool:
    """``pid`` is gone or a zombie within ``seconds`` (its parent, process 0, is dead: nobody may reap it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False
