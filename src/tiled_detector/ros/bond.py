"""The bond a managed node keeps with Nav2's lifecycle manager, through bondpy (ros/bond_core, ros2 branch).

nav2_lifecycle_manager (Humble and Jazzy, `nav2_lifecycle_manager/src/lifecycle_manager.cpp`) activates each
node it manages, then creates its side of a bond (topic `bond`, id = the node's name, heartbeat period 0.1 s,
timeout its `bond_timeout`, 4 s by default) and waits half of `bond_timeout` for it to form: a node that forms
none aborts the whole bringup ("Server ... was unable to be reached ... by bond"). Nav2's own nodes create their
side in on_activate and destroy it in on_deactivate (`nav2_util/src/lifecycle_node.cpp` createBond / destroyBond:
heartbeat period 0.1 s, on Jazzy the parameter `bond_heartbeat_period`, <= 0 for none; timeout 4 s), and their side
never times out on the manager's heartbeat (the node's constructor sets bond's `bond_disable_heartbeat_timeout`:
"server side never times out from lifecycle manager"): an executor busy for longer than the timeout (the bond's
subscription waits for it) would otherwise break the bond, and the manager, seeing it broken, resets every node it
manages. This node does the same, with the same parameter (`node_side`).

The bond topic is relative: a node in a namespace bonds on `<namespace>/bond`, with a manager of that namespace
(Nav2 runs one lifecycle manager per namespace; its `node_names` are the node names without the namespace).

bondpy is not on PyPI: where it does not import, the node says so once (INFO) and forms no bond (a lifecycle
manager then needs `bond_timeout: 0.0`, which makes it bond with no node). A bond the manager breaks while formed
(it ended or reset) is one WARN; the node keeps its state. A bond no manager answers (the node driven by
`ros2 lifecycle` or `autostart`) gives up after bondpy's connect timeout (10 s) with one DEBUG line.
"""

from __future__ import annotations

import threading
from typing import Any

from rclpy.duration import Duration

TOPIC = "bond"
PERIOD_PARAMETER = "bond_heartbeat_period"
HEARTBEAT_PERIOD_S = 0.1  # Nav2's createBond (Humble: fixed; Jazzy: bond_heartbeat_period's default)
HEARTBEAT_TIMEOUT_S = 4.0  # Nav2's createBond (sent in the bond's status; this side never times out)
BREAK_WAIT_S = 0.1  # bondcpp's ~Bond waits this long for a broken bond to be acknowledged


def node_side(bond_type: type) -> type:
    """`bond_type` (bondpy's Bond) whose heartbeat timeout never breaks it: the node's side, as Nav2's nodes keep it
    (module docstring). bondpy checks `bond_disable_heartbeat_timeout` by declaring it on the node at each timeout
    (`_on_heartbeat_timeout`), which rclpy refuses from the second timeout on; so the timeout is overridden here.
    The bond still breaks when the manager breaks it, or this node."""

    class NodeSideBond(bond_type):  # type: ignore[misc, valid-type]
        def _on_heartbeat_timeout(self) -> None:
            self.node.get_logger().debug(
                f"no heartbeat from the lifecycle manager for {HEARTBEAT_TIMEOUT_S:g} s: the bond is kept (a "
                "managed node never times out on its manager, as Nav2's)"
            )

    return NodeSideBond


def import_bond() -> Any:
    """bondpy's Bond class, or None where bondpy does not import."""
    try:
        from bondpy.bondpy import Bond
    except ImportError:
        return None
    return Bond


class ManagerBond:
    """A managed node's side of its bond with a lifecycle manager: `form` on activate, `release` on deactivate
    (and wherever the node leaves the active state)."""

    def __init__(self, node: Any, bond_type: Any = None) -> None:
        self._node = node
        bond_type = import_bond() if bond_type is None else bond_type
        self._type = None if bond_type is None else node_side(bond_type)
        self._bond: Any = None
        self._formed = False
        self._lock = threading.Lock()
        self._said_missing = False

    @property
    def formed(self) -> bool:
        """Whether the current bond has formed and not broken."""
        with self._lock:
            return self._bond is not None and self._formed

    def form(self, heartbeat_period: float) -> None:
        """Start this node's side of the bond (a period <= 0: none, as Nav2's nodes do)."""
        self.release()
        if heartbeat_period <= 0:
            return
        if self._type is None:
            if not self._said_missing:
                self._said_missing = True
                self._node.get_logger().info(
                    "bondpy does not import: no bond to a lifecycle manager (nav2_lifecycle_manager then needs "
                    "bond_timeout: 0.0; install ros-$ROS_DISTRO-bondpy)"
                )
            return
        bond = self._type(self._node, TOPIC, self._node.get_name())
        bond.heartbeat_period = heartbeat_period
        bond.heartbeat_timeout = HEARTBEAT_TIMEOUT_S
        bond.set_formed_callback(lambda: self._on_formed(bond))
        bond.set_broken_callback(lambda: self._on_broken(bond))
        with self._lock:
            self._bond, self._formed = bond, False
        bond.start()

    def release(self) -> None:
        """Break this node's side of the bond (the manager sees it break) and free its endpoints."""
        with self._lock:
            bond, self._bond, self._formed = self._bond, None, False
        if bond is None:
            return
        # as bondcpp's ~Bond (ros/bond_core, ros2 branch, bondcpp/src/bond.cpp): break, then up to 100 ms while
        # bondpy's thread repeats the end to the manager (destroyed at once, the one message can be lost)
        bond.break_bond()
        bond.wait_until_broken(Duration(seconds=BREAK_WAIT_S))
        # bondpy's shutdown destroys its subscription itself, leaving it in the node's list, where an executor then
        # raises InvalidHandle: the node destroys it first (destroying twice is harmless)
        self._node.destroy_subscription(bond.sub)
        bond.shutdown()
        self._node.destroy_publisher(bond.pub)

    def _on_formed(self, bond: Any) -> None:
        with self._lock:
            if bond is not self._bond:
                return
            self._formed = True
        self._node.get_logger().info(f"bond formed with the lifecycle manager (topic {TOPIC}, id {bond.id})")

    def _on_broken(self, bond: Any) -> None:
        with self._lock:
            if bond is not self._bond:  # released by this node: the manager was told
                return
            formed, self._formed = self._formed, False
        if formed:
            self._node.get_logger().warning(
                "the bond with the lifecycle manager broke (the manager ended or reset); the node stays in its state"
            )
        else:
            self._node.get_logger().debug("no lifecycle manager formed a bond (none is running: fine)")
