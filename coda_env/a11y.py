"""A small AT-SPI client that speaks the accessibility D-Bus protocol directly (through `jeepney`).

Why not pyatspi: it lives in the system Python only. AT-SPI's D-Bus interface is documented and stable, and
talking to it directly lets us pipeline requests: a whole subtree is read a level at a time with every
request of a level in flight at once, instead of one round trip per property.

The module needs only the standard library and jeepney, so it also runs as a script inside a VM guest
(`python3 a11y.py tree ADDRESS APP`), where the libvirt backend runs it through the guest agent and reads
the tree it prints as JSON: the guest's accessibility bus is not reachable from the host.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

ACC = "org.a11y.atspi.Accessible"
PROPS = "org.freedesktop.DBus.Properties"
REGISTRY = ("org.a11y.atspi.Registry", "/org/a11y/atspi/accessible/root")


# bit positions of AtspiStateType
_STATES = {
    "active": 1,
    "checked": 4,
    "editable": 7,
    "enabled": 8,
    "focused": 12,
    "selected": 23,
    "showing": 25,
    "visible": 30,
}


class A11yError(RuntimeError):
    """The accessibility bus or an application on it did not answer."""


def bus_address(session_address: str) -> str:
    """The accessibility bus's address: asked of org.a11y.Bus on a session bus (at-spi-bus-launcher's), or
    `session_address` itself when that is an accessibility bus (the local backend's, which has no launcher;
    AT-SPI's registry is on it)."""
    conn = open_dbus_connection(session_address)
    try:
        bus = DBusAddress("/org/a11y/bus", bus_name="org.a11y.Bus", interface="org.a11y.Bus")
        reply = conn.send_and_get_reply(new_method_call(bus, "GetAddress"), timeout=2)
        if reply.header.message_type == MessageType.error:
            dbus = DBusAddress(
                "/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus"
            )
            names = conn.send_and_get_reply(new_method_call(dbus, "ListActivatableNames"), timeout=2)
            if names.header.message_type != MessageType.error and REGISTRY[0] in names.body[0]:
                return session_address
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
            new_method_call(st, "Set", "ssv", ("org.a11y.Status", "IsEnabled", ("b", True))), timeout=2
        )
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
    states: frozenset[str] | None = None  # filled for `details_roles` (else ask the client)
    extents: tuple[int, int, int, int] | None = None  # screen x, y, width, height, likewise

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

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"bus": self.bus, "path": self.path, "role": self.role, "name": self.name}
        if self.text is not None:
            d["text"] = self.text
        if self.states is not None:
            d["states"] = sorted(self.states)
        if self.extents is not None:
            d["extents"] = list(self.extents)
        if self.children:
            d["children"] = [c.to_dict() for c in self.children]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Node":
        try:
            ext = d.get("extents")
            return cls(
                bus=str(d["bus"]),
                path=str(d["path"]),
                role=str(d.get("role", "")),
                name=str(d.get("name", "")),
                text=d.get("text"),
                states=frozenset(d["states"]) if "states" in d else None,
                extents=tuple(int(v) for v in ext) if ext is not None else None,  # type: ignore[arg-type]
                children=[cls.from_dict(c) for c in d.get("children", ())],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise A11yError(f"malformed accessibility tree: {e!r}") from None


# ------------------------------------------------------------------------------------------ the table
# The `a11y_tree` observation of the apps that give boxes (KAlgebra, TeXstudio, GRASS): a header line naming
# tab-separated columns, then one row per element on screen. Columns: role, name, optionally text and states,
# and the box as `x,y,w,h` (screen pixels; the column is called "box" or "x,y,w,h").


@dataclass(frozen=True)
class Element:
    """One row of an a11y table: an element on screen and its box (left, top, right, bottom, edges included)."""

    role: str
    name: str
    box: tuple[int, int, int, int]
    text: str = ""
    states: frozenset[str] = frozenset()

    @property
    def center(self) -> tuple[int, int]:
        return (self.box[0] + self.box[2]) // 2, (self.box[1] + self.box[3]) // 2

    @property
    def area(self) -> int:
        return (self.box[2] - self.box[0] + 1) * (self.box[3] - self.box[1] + 1)

    def contains(self, x: int, y: int) -> bool:
        return self.box[0] <= x <= self.box[2] and self.box[1] <= y <= self.box[3]


def _cell(value: str) -> str:
    return " ".join(value.split())  # no tabs or newlines inside a cell


def table_text(
    rows: Iterable[tuple[str, str, str, tuple[int, int, int, int], Iterable[str]]], max_chars: int = 1_000_000
) -> str:
    """(role, name, text, (x, y, w, h), states) rows -> an a11y table with the columns role, name, text,
    x,y,w,h and states; cut (with a last line saying so) before it passes `max_chars`."""
    out, size = ["role\tname\ttext\tx,y,w,h\tstates"], 0
    for role, name, text, ext, states in rows:
        line = "\t".join(
            [_cell(role), _cell(name), _cell(text or ""), ",".join(str(int(v)) for v in ext), ",".join(sorted(states))]
        )
        size += len(line) + 1
        if size > max_chars:
            out.append("... (truncated)")
            break
        out.append(line)
    return "\n".join(out)


def _unquote(s: str) -> str:
    """A cell written as a Python string literal (TeXstudio's text column) without its quotes; nothing here is
    evaluated."""
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1].replace("\\n", " ").replace("\\t", " ").replace("\\'", "'").replace('\\"', '"')
    return s


def parse_table(text: str | None) -> list[Element]:
    """The elements of an a11y table (the `a11y_tree` observation of KAlgebra, TeXstudio and GRASS), those with
    a box of positive size; [] for text in another shape (an app whose observation has no boxes)."""
    if not text:
        return []
    lines = text.splitlines()
    header = lines[0].split("\t")
    if "role" not in header or "name" not in header:
        return []
    col = {h: i for i, h in enumerate(header)}
    where = col.get("x,y,w,h", col.get("box"))
    if where is None:
        return []
    out = []
    for line in lines[1:]:
        cells = line.split("\t")
        if len(cells) <= where:
            continue
        try:
            x, y, w, h = (int(v) for v in cells[where].split(","))
        except ValueError:
            continue
        if w <= 0 or h <= 0:
            continue
        get = lambda name: cells[col[name]] if name in col and col[name] < len(cells) else ""  # noqa: E731
        states = frozenset(s for s in get("states").split(",") if s)
        out.append(Element(get("role"), get("name"), (x, y, x + w - 1, y + h - 1), _unquote(get("text")), states))
    return out


def element_at(elements: Iterable[Element], x: int, y: int, max_area: int | None = None) -> Element | None:
    """The smallest element whose box holds (x, y) (edges included), of at most `max_area` pixels."""
    best = None
    for e in elements:
        if e.contains(x, y) and (max_area is None or e.area <= max_area) and (best is None or e.area < best.area):
            best = e
    return best


class A11ySource(Protocol):
    """What app adapters read accessibility through (`Desktop.a11y()`): `A11yClient` on this machine's bus,
    or a reader that runs this module inside a VM guest."""

    def app_tree(
        self,
        name: str,
        skip_roles: frozenset[str] = frozenset(),
        texts: bool = False,
        details_roles: frozenset[str] = frozenset(),
    ) -> Node | None:
        """The named application's tree (None when it is not on the bus), without the subtrees of
        `skip_roles`; `texts` also reads text widgets' contents, and the nodes of `details_roles` get their
        states and extents stored (which `states`/`extents` of a remote reader can only answer from)."""

    def showing_rows(
        self,
        name: str,
        max_nodes: int,
        text_roles: frozenset[str] = frozenset(),
        unlisted: frozenset[str] = frozenset(),
        skip_roles: frozenset[str] = frozenset(),
        text_limit: int = 2000,
    ) -> list[tuple] | None:
        """(depth, role, name, text, (x, y, w, h), states) of what application `name` shows on screen, in tree
        order (None when it is not on the bus): subtrees that are not showing are never read."""

    def states(self, node: Node) -> set[str]: ...
    def extents(self, node: Node) -> tuple[int, int, int, int] | None: ...
    def close(self) -> None: ...


class A11yAdapter:
    """What app adapters that read their app through AT-SPI share: one connection to the desktop's
    accessibility (any A11ySource: this machine's bus, or a VM guest's reader) per episode, opened when
    first needed and closed with the episode (`close()`, which the env calls at every reset)."""

    _a11y: "A11ySource | None" = None

    def _client(self, desktop: Any) -> "A11ySource":
        if self._a11y is None:
            self._a11y = desktop.a11y()
        return self._a11y

    def close(self) -> None:
        if self._a11y is not None:
            try:
                self._a11y.close()
            except Exception:  # noqa: BLE001 - the bus may be gone with the desktop
                pass
        self._a11y = None


class A11yClient:
    """A connection to the AT-SPI bus of one desktop."""

    def __init__(self, session_address: str | None = None, timeout: float = 5.0, *, a11y_address: str | None = None):
        """Either the accessibility bus's own address, or a session bus whose org.a11y.Bus names it."""
        self.timeout = timeout
        self._pinned: dict[str, str] = {}  # app name -> the bus connection it was first found on
        try:
            self._conn = open_dbus_connection(a11y_address or bus_address(session_address or ""))
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
        """The first application of that name on the bus; once found, always that one (its bus connection):
        a program that registers later under the same name (an app's terminal could start one) is never
        read in its place, while this client lives (the adapters keep one per episode)."""
        apps = self.applications()
        pinned = self._pinned.get(name)
        if pinned is not None:
            return next((a for a in apps if a.bus == pinned and a.name == name), None)
        app = next((a for a in apps if a.name == name), None)
        if app is not None:
            self._pinned[name] = app.bus
        return app

    def showing_rows(
        self,
        name: str,
        max_nodes: int,
        text_roles: frozenset[str] = frozenset(),
        unlisted: frozenset[str] = frozenset(),
        skip_roles: frozenset[str] = frozenset(),
        text_limit: int = 2000,
    ) -> list[tuple] | None:
        """(depth, role, name, text, extents, states) of the showing and visible nodes of application `name`
        (None when it is not on the bus), in tree order. Read breadth-first, each level's requests
        pipelined; subtrees whose root is not showing, or is of a `skip_roles` role, are never read; at most
        `max_nodes`. Unnamed nodes of the `unlisted` roles (containers) are walked through, not listed;
        `text_roles` nodes come with their text (up to `text_limit` characters)."""
        app = self.application(name)
        if app is None:
            return None
        many = self._many
        rows: list[tuple] = []
        level: list[tuple[Node, int, tuple]] = [(app, -1, ())]
        count = 0
        while level and count < max_nodes:
            res = many([(n.bus, n.path, ACC, "GetChildren", None, ()) for n, _, _ in level])
            kids: list[tuple[Node, int, tuple]] = []
            for (n, depth, where), body in zip(level, res):
                for i, (b, p) in enumerate(body[0] if body else []):
                    kids.append((Node(b, p), depth + 1, where + (i,)))
            if not kids:
                break
            kids = kids[: 4 * max_nodes]
            calls = []
            for n, _, _ in kids:
                calls += [
                    (n.bus, n.path, ACC, "GetRoleName", None, ()),
                    (n.bus, n.path, PROPS, "Get", "ss", (ACC, "Name")),
                    (n.bus, n.path, ACC, "GetState", None, ()),
                ]
            res = many(calls)
            shown: list[tuple[Node, int, tuple]] = []
            for i, (n, depth, where) in enumerate(kids):
                role, nm, st = res[3 * i], res[3 * i + 1], res[3 * i + 2]
                n.role = role[0] if role else ""
                n.name = nm[0][1] if nm else ""
                n.states = frozenset(_state_names(st[0])) if st else frozenset()
                if (
                    "showing" in n.states
                    and "visible" in n.states
                    and n.role != "scroll bar"
                    and n.role not in skip_roles
                ):
                    shown.append((n, depth, where))
            shown = shown[: max_nodes - count]
            count += len(shown)
            listed = [(n, d, w) for n, d, w in shown if n.name or n.role not in unlisted]
            calls = [(n.bus, n.path, "org.a11y.atspi.Component", "GetExtents", "u", (0,)) for n, _, _ in listed]
            calls += [
                (n.bus, n.path, "org.a11y.atspi.Text", "GetText", "ii", (0, text_limit))
                for n, _, _ in listed
                if n.role in text_roles
            ]
            res = many(calls) if calls else []
            ext = res[: len(listed)]
            texts = iter(res[len(listed) :])
            for (n, d, w), e in zip(listed, ext):
                text = next(texts) if n.role in text_roles else None
                if not e or e[0][2] <= 0 or e[0][3] <= 0:  # no box on screen (a stale or collapsed widget)
                    continue
                rows.append((w, (d, n.role, n.name, text[0] if text else None, tuple(e[0]), sorted(n.states))))
            level = shown
        rows.sort(key=lambda r: r[0])  # tree order (depth first), as a person reads it
        return [r for _, r in rows]

    def app_tree(
        self,
        name: str,
        skip_roles: frozenset[str] = frozenset(),
        texts: bool = False,
        details_roles: frozenset[str] = frozenset(),
    ) -> Node | None:
        """`application(name)` and its `tree`; the nodes of `details_roles` also get their states and extents
        stored."""
        app = self.application(name)
        if app is None:
            return None
        root = self.tree(app, skip_roles=skip_roles, texts=texts)
        nodes = [n for n in root.walk() if n.role in details_roles]
        if nodes:
            calls = [(n.bus, n.path, ACC, "GetState", None, ()) for n in nodes]
            calls += [(n.bus, n.path, "org.a11y.atspi.Component", "GetExtents", "u", (0,)) for n in nodes]
            res = self._many(calls)
            for n, st, ext in zip(nodes, res[: len(nodes)], res[len(nodes) :]):
                n.states = frozenset(_state_names(st[0])) if st else frozenset()
                n.extents = tuple(ext[0]) if ext else None  # type: ignore[assignment]
        return root

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

    def tree(self, root: Node, depth: int = 64, skip_roles: frozenset[str] = frozenset(), texts: bool = False) -> Node:
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
        return _state_names(body[0]) if body else set()

    def extents(self, node: Node) -> tuple[int, int, int, int] | None:
        body = self._many([(node.bus, node.path, "org.a11y.atspi.Component", "GetExtents", "u", (0,))])[0]
        return tuple(body[0]) if body else None


def _state_names(words: Any) -> set[str]:
    bits = words[0] | (words[1] << 32)
    return {name for name, bit in _STATES.items() if bits >> bit & 1}


def main(argv: list[str]) -> int:
    """`a11y.py apps ADDRESS`: the applications on the bus, one name a line (this also activates AT-SPI's
    registry). `a11y.py showing ADDRESS APP [--max N] [--text ROLE]... [--unlisted ROLE]... [--skip ROLE]...
    [--text-limit N]`: what APP shows
    on screen, as JSON rows (`showing_rows`). `a11y.py tree ADDRESS APP [--texts] [--skip ROLE]... [--details ROLE]...`: APP's tree as JSON
    (`null` when APP is not on the bus), with the states and extents of the --details roles' nodes. ADDRESS
    is the D-Bus session bus address; `-`: $DBUS_SESSION_BUS_ADDRESS."""
    if len(argv) < 2 or argv[0] not in ("apps", "tree", "showing") or (argv[0] != "apps" and len(argv) < 3):
        print(main.__doc__, file=sys.stderr)
        return 2
    # "-": the caller's own bus, as a toolkit finds it (AT_SPI_BUS_ADDRESS first, as atk-bridge and Qt do)
    address = (
        os.environ.get("AT_SPI_BUS_ADDRESS") or os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
        if argv[1] == "-"
        else argv[1]
    )
    try:
        client = A11yClient(address)
        try:
            if argv[0] == "apps":
                print("\n".join(a.name for a in client.applications()))
                return 0
            rest = argv[3:]

            def roles(flag: str) -> frozenset[str]:
                return frozenset(rest[i + 1] for i, a in enumerate(rest[:-1]) if a == flag)

            if argv[0] == "showing":
                most = next((int(rest[i + 1]) for i, a in enumerate(rest[:-1]) if a == "--max"), 400)
                limit = next((int(rest[i + 1]) for i, a in enumerate(rest[:-1]) if a == "--text-limit"), 2000)
                rows = client.showing_rows(argv[2], most, roles("--text"), roles("--unlisted"), roles("--skip"), limit)
                json.dump(rows, sys.stdout, separators=(",", ":"))
                return 0
            root = client.app_tree(
                argv[2], skip_roles=roles("--skip"), texts="--texts" in rest, details_roles=roles("--details")
            )
        finally:
            client.close()
    except A11yError as e:
        print(f"a11y: {e}", file=sys.stderr)
        return 1
    json.dump(root.to_dict() if root is not None else None, sys.stdout, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
