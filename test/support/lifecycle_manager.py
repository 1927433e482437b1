"""nav2_lifecycle_manager's side of a managed node's bringup, with the real bondpy: a stand-in for the test.

What nav2_lifecycle_manager does (`nav2_lifecycle_manager/src/lifecycle_manager.cpp`, Humble and Jazzy): change
the node's state through its lifecycle services; after `activate`, create a bond (topic `bond`, id = the node's
name, heartbeat period 0.1 s, heartbeat timeout `bond_timeout`, 4 s by default) and wait half of `bond_timeout`
for it to form (else "Server ... was unable to be reached"); after `deactivate`, drop its bond.

Usage: python lifecycle_manager.py NODE STEP... with steps `configure`, `activate` (then bond), `deactivate`
(then watch the bond break, and drop it), `bond` (bond with the node as it is, no transition, waiting up to
`BOND_WAIT_S` for its side: started before `ros2 lifecycle set activate`), `break` (break the
bond the node keeps, as a manager that ends or resets does: bondcpp's ~Bond), `vanish` (after a second of
heartbeats, end at once, the bond left unbroken: a manager that died).
One JSON line per step on stdout: {"step": ..., "ok": ..., "seconds": ...}.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import rclpy
from bondpy.bondpy import Bond
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.duration import Duration
from rclpy.executors import MultiThreadedExecutor

BOND_TIMEOUT_S = 4.0  # nav2_lifecycle_manager's bond_timeout default
BOND_WAIT_S = 60.0  # `bond`: how long the node's side may take to start
TRANSITIONS = {
    "configure": Transition.TRANSITION_CONFIGURE,
    "activate": Transition.TRANSITION_ACTIVATE,
    "deactivate": Transition.TRANSITION_DEACTIVATE,
}


def say(step: str, ok: bool, started: float) -> None:
    print(json.dumps({"step": step, "ok": ok, "seconds": round(time.monotonic() - started, 3)}), flush=True)


def main(target: str, steps: list[str]) -> int:
    rclpy.init()
    namespace, _, name = target.rpartition("/")
    node = rclpy.create_node("lifecycle_manager", namespace=namespace or "/")
    executor = MultiThreadedExecutor()
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    client = node.create_client(ChangeState, f"{target}/change_state")
    if not client.wait_for_service(timeout_sec=60.0):
        say("services", False, time.monotonic())
        return 1
    bond = None
    for step in steps:
        started = time.monotonic()
        if step == "vanish":
            # (a manager that has run a while: bondpy times a sister out from its 2nd heartbeat)
            time.sleep(1.0)
            say(step, True, started)
            os._exit(0)  # no bond broken, no node destroyed: the manager is just gone
        if step in TRANSITIONS:
            request = ChangeState.Request(transition=Transition(id=TRANSITIONS[step]))
            future = client.call_async(request)
            while not future.done() and time.monotonic() - started < 60.0:
                time.sleep(0.01)
            ok = future.done() and future.result().success
        else:
            ok = step in ("bond", "break")
        if ok and step in ("activate", "bond"):
            wait = BOND_TIMEOUT_S / 2 if step == "activate" else BOND_WAIT_S
            bond = Bond(node, "bond", name)
            bond.heartbeat_period = 0.1
            bond.heartbeat_timeout = BOND_TIMEOUT_S
            bond.connect_timeout = wait
            bond.start()
            ok = bond.wait_until_formed(Duration(seconds=wait))
        elif ok and step in ("deactivate", "break") and bond is not None:
            if step == "break":
                bond.break_bond()
            # the node's break reaches a loaded host's manager late at times (kilted, the CI's first test pass):
            # twice the heartbeat timeout
            ok = bond.wait_until_broken(Duration(seconds=2 * BOND_TIMEOUT_S))
            node.destroy_subscription(bond.sub)  # (before bondpy destroys it behind the executor's back)
            bond.shutdown()
            node.destroy_publisher(bond.pub)
            bond = None
        say(step, bool(ok), started)
    executor.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
