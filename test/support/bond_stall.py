"""A managed node's side of its bond (`tiled_detector.ros.bond.ManagerBond`, the real bondpy) while its executor is
busy for longer than the bond's heartbeat timeout, with nav2_lifecycle_manager's side in another node of the same
process: a stand-in for the test (test_ros_tools.py).

What it plays: nav2_lifecycle_manager bonds with the node (`bond`, id = the node's name, heartbeat period 0.1 s,
timeout 4 s: `lifecycle_manager.cpp` createBondConnection) and resets every node it manages when its side breaks
(`checkBondConnections`). The node's executor is then held by one callback for STALL_S seconds (a long transition
or parameter callback does that): bondpy's status subscription waits for the executor, its heartbeats go out from
its own thread.

Usage: python bond_stall.py. One JSON line on stdout: {"formed": ..., "manager_broken": ..., "node_formed": ...}.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import rclpy
from bondpy.bondpy import Bond
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor

from tiled_detector.ros.bond import HEARTBEAT_PERIOD_S, ManagerBond

STALL_S = 6.0  # > the 4 s heartbeat timeout of both sides
NAME = "stalled_node"


def spin(node: rclpy.node.Node) -> tuple[SingleThreadedExecutor, threading.Thread]:
    """`node` spun by an executor of its own, in a thread."""
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    return executor, thread


def main() -> int:
    rclpy.init()
    node = rclpy.create_node(NAME, namespace="/stall")
    manager = rclpy.create_node("lifecycle_manager", namespace="/stall")
    executors = [spin(node), spin(manager)]
    side = ManagerBond(node)
    side.form(HEARTBEAT_PERIOD_S)
    peer = Bond(manager, "bond", NAME)
    peer.heartbeat_period = 0.1
    peer.heartbeat_timeout = 4.0
    peer.start()
    formed = bool(peer.wait_until_formed(Duration(seconds=5.0)))
    deadline = time.monotonic() + 5.0
    while not side.formed and time.monotonic() < deadline:
        time.sleep(0.05)
    formed = formed and side.formed
    time.sleep(
        1.0
    )  # heartbeats flowing both ways (the node's side starts its heartbeat timer at the first one)
    stall = None

    def hold() -> None:
        stall.cancel()
        time.sleep(STALL_S)  # the node's executor is busy: no bond status reaches its side meanwhile

    stall = node.create_timer(0.01, hold)
    time.sleep(STALL_S + 4.0)  # (a side that stopped at 4 s: the other times out 4 s later)
    print(
        json.dumps({"formed": formed, "manager_broken": peer.is_broken(), "node_formed": side.formed}),
        flush=True,
    )
    side.release()
    manager.destroy_subscription(peer.sub)
    peer.shutdown()
    manager.destroy_publisher(peer.pub)
    for executor, thread in executors:
        executor.shutdown()
        thread.join(timeout=5.0)
    node.destroy_node()
    manager.destroy_node()
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
