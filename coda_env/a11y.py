"""A small AT-SPI client that speaks the accessibility D-Bus protocol directly (through `jeepney`).

Why not pyatspi: it lives in the system Python only. AT-SPI's D-Bus interface is documented and stable, and
talking to it directly lets us pipeline requests: a whole subtree is read a level at a time with every
request of a level in flight at once, instead of one round trip per property.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

ACC = "org.a11y.atspi.Accessible"
PROPS = "org.freedesktop.DBus.Properties"
REGISTRY = ("org.a11y.atspi.Registry", "/org/a11y/atspi/accessible/root")


# bit positions of AtspiStateType
_STATES = {"active": 1, "checked": 4, "editable": 7, "enabled": 8, "focused": 12, "selected": 23,
           "showing": 25, "visible": 30}


class A11yError(RuntimeError):
    """The accessibility bus or an application on it did not answer."""


def bus_address(session_address: str) -> str:
    conn = open_dbus_connection(session_address)
    try:
        bus = DBusAddress("/org/a11y/bus", bus_name="org.a11y.Bus", interface="org.a11y.Bus")
        reply = conn.send_and_get_reply(new_method_call(bus, "GetAddress"), timeout=2)
        if reply.header.message_type == MessageType.error:
            raise A11yError(f"org.a11y.Bus.GetAddress failed: {reply.body}")
        return reply.body[0]
    finally:
        conn.close()


def enable_accessibility(session_address: str) -> None:
    """Set org.a11y.Status.IsEnabled, which toolkits watch to switch their bridges on."""
    conn = open_dbus_connection(session_address)
    try:
        st = DBusAddress("/org/a11y/bus", bus_name="org.a11y.Bus", interface=PROPS)
        reply = conn.send_and_get_reply(
            new_method_call(st, "Set", "ssv", ("org.a11y.Status", "IsEnabled", ("b", True))), timeout=2)
        if reply.header.message_type == MessageType.error:
            raise A11yError(f"cannot enable accessibility: {reply.body}")
    finally:
        conn.close()


@dataclass
class Node:
    """One accessible object: enough to find widgets by role and name and to read their content."""
    bus: str
    path: str
    role: str = ""
    name: str = ""
    children: list["Node"] = field(default_factory=list)
    text: str | None = None

    def walk(self) -> Iterator["Node"]:
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, role: str | None = None, name: str | None = None) -> Iterator["Node"]:
        for n in self.walk():
            if (role is None or n.role == role) and (name is None or n.name == name):
                yield n

    def first(self, role: str | None = None, name: str | None = None) -> "Node | None":
        return next(self.find(role, name), None)

    def to_text(self, depth: int = 0) -> str:
        """An indented one-line-per-node rendering (the `a11y_tree` observation)."""
        line = "  " * depth + f"{self.role} {self.name!r}" + (f" text={self.text!r}" if self.text else "")
        return "\n".join([line] + [c.to_text(depth + 1) for c in self.children])


class A11yClient:
    """A connection to the AT-SPI bus of one desktop."""

    def __init__(self, session_address: str, timeout: float = 5.0):
        self.timeout = timeout
        try:
            self._conn = open_dbus_connection(bus_address(session_address))
        except Exception as e:
            raise A11yError(f"cannot reach the accessibility bus: {e}") from None

    def close(self) -> None:
        self._conn.close()

    def _many(self, calls: Iterable[tuple[str, str, str, str, str | None, tuple]]) -> list:
        """Send every call at once and collect the replies in order (errors come back as None)."""
        serials = []
        for bus, path, iface, method, sig, body in calls:
            msg = new_method_call(DBusAddress(path, bus_name=bus, interface=iface), method, sig, body)
            serial = next(self._conn.outgoing_serial)
            self._conn.send(msg, serial=serial)
            serials.append(serial)
        want = {s: i for i, s in enumerate(serials)}
        out: list = [None] * len(serials)
        import time
        deadline = time.monotonic() + self.timeout
        while want:
            left = deadline - time.monotonic()
            if left <= 0:
                raise A11yError(f"{len(want)} accessibility requests got no answer within {self.timeout}s")
            try:
                msg = self._conn.receive(timeout=left)
            except TimeoutError:
                raise A11yError(f"{len(want)} accessibility requests got no answer within {self.timeout}s") from None
            except (OSError, ConnectionError) as e:
                raise A11yError(f"the accessibility bus connection failed: {e}") from None
            rs = msg.header.fields.get(HeaderFields.reply_serial)
            if rs in want:
                i = want.pop(rs)
                if msg.header.message_type == MessageType.method_return:
                    out[i] = msg.body
        return out

    def applications(self) -> list[Node]:
        body = self._many([(*REGISTRY, ACC, "GetChildren", None, ())])[0]
        apps = [Node(b, p) for b, p in (body[0] if body else [])]
        self._fill(apps)
        return apps

    def application(self, name: str) -> Node | None:
        return next((a for a in self.applications() if a.name == name), None)

    def _fill(self, nodes: list[Node]) -> None:
        calls = []
        for n in nodes:
            calls.append((n.bus, n.path, ACC, "GetRoleName", None, ()))
            calls.append((n.bus, n.path, PROPS, "Get", "ss", (ACC, "Name")))
        res = self._many(calls)
        for i, n in enumerate(nodes):
            role, name = res[2 * i], res[2 * i + 1]
            n.role = role[0] if role else ""
            n.name = name[0][1] if name else ""

    def tree(self, root: Node, depth: int = 64, skip_roles: frozenset[str] = frozenset(),
             texts: bool = False) -> Node:
        """Read the subtree under `root`, a level at a time with all requests of a level in flight."""
        level = [root]
        for _ in range(depth):
            level = [n for n in level if n.role not in skip_roles]
            if not level:
                break
            res = self._many([(n.bus, n.path, ACC, "GetChildren", None, ()) for n in level])
            nxt = []
            for n, body in zip(level, res):
                n.children = [Node(b, p) for b, p in (body[0] if body else [])]
                nxt.extend(n.children)
            if not nxt:
                break
            self._fill(nxt)
            if texts:
                self._texts([n for n in nxt if n.role in ("text", "spin box", "entry", "terminal")])
            level = nxt
        return root

    def _texts(self, nodes: list[Node]) -> None:
        if not nodes:
            return
        res = self._many([(n.bus, n.path, "org.a11y.atspi.Text", "GetText", "ii", (0, -1)) for n in nodes])
        for n, body in zip(nodes, res):
            n.text = body[0] if body else None

    def text(self, node: Node) -> str | None:
        self._texts([node])
        return node.text

    def states(self, node: Node) -> set[str]:
        """The node's AT-SPI state names that matter for reading an app ('selected', 'checked', ...)."""
        body = self._many([(node.bus, node.path, ACC, "GetState", None, ())])[0]
        if not body:
            return set()
        bits = body[0][0] | (body[0][1] << 32)
        return {name for name, bit in _STATES.items() if bits >> bit & 1}

    def extents(self, node: Node) -> tuple[int, int, int, int] | None:
        body = self._many([(node.bus, node.path, "org.a11y.atspi.Component", "GetExtents", "u", (0,))])[0]
        return tuple(body[0]) if body else None
