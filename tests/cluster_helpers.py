"""A real local Redis Cluster for the cluster tests: 3 masters and 3 replicas on free
loopback ports, started and torn down by :class:`LocalCluster`.

Every node runs with ``--cluster-node-timeout 1000`` (a dead master is failed over in
about two seconds), ``--repl-diskless-sync-delay 0`` (a replica syncs at once; with
the default delay a master killed early has no replica in sync and is never replaced)
and ``--cluster-require-full-coverage no`` (see README, "Running on Redis Cluster").
:meth:`LocalCluster.start` returns once every replica reports ``master_link_status:up``.

Run as a script (``python tests/cluster_helpers.py``), it starts a cluster, prints its
``redis+cluster://`` URL and keeps it up until interrupted (for the benchmark by hand).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from wakeful.script_runner import FIRST_DUE, RENEW_ALL, SEND_AFTER, SEND_WAKE_AFTER

NODE_TIMEOUT_MS = 1000
START_TIMEOUT_S = 60.0


def free_ports(n: int) -> list[int]:
    """``n`` free loopback ports whose cluster bus ports (+10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def wait_until(condition: object, timeout_s: float, what: str, step_s: float = 0.05) -> None:
    """Poll ``condition()`` until it is true; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if condition():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(step_s)
    raise TimeoutError(f"{what} within {timeout_s:.0f} s (last error: {last})")


@dataclass
class Node:
    port: int
    proc: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=2)


@dataclass
class LocalCluster:
    """A 6-node cluster (3 masters, 3 replicas) in a temporary directory."""

    masters: int = 3
    replicas_per_master: int = 1
    extra_args: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    directory: str = ""

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.alive()[:3])
        return f"redis+cluster://{seeds}"

    def alive(self) -> list[Node]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def start(self) -> LocalCluster:
        total = self.masters * (1 + self.replicas_per_master)
        self.directory = tempfile.mkdtemp(prefix="wakeful-cluster-")
        for port in free_ports(total):
            workdir = os.path.join(self.directory, str(port))
            os.makedirs(workdir)
            args = [
                shutil.which("redis-server") or "redis-server",
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--repl-diskless-sync-delay", "0",
                # Healthy masters keep serving their slots while another master's slots
                # are uncovered (between its failure and its replica's promotion): with
                # the default (yes) every node answers CLUSTERDOWN meanwhile.
                "--cluster-require-full-coverage", "no",
                "--save", "",
                "--appendonly", "no",
                "--dir", workdir,
                "--logfile", os.path.join(workdir, "redis.log"),
                *self.extra_args,
            ]  # fmt: skip
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.nodes.append(Node(port, proc, args))
        try:
            for node in self.nodes:
                wait_until(node.client().ping, 10, f"redis-server on port {node.port} answers")
            create = [
                shutil.which("redis-cli") or "redis-cli",
                "--cluster", "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas", str(self.replicas_per_master),
                "--cluster-yes",
            ]  # fmt: skip
            subprocess.run(create, check=True, capture_output=True, timeout=60)
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every live node says ``cluster_state:ok`` and every live replica's link
        to its master is up."""

        def healthy() -> bool:
            for node in self.alive():
                c = node.client()
                if c.cluster("INFO").get("cluster_state") != "ok":  # type: ignore[union-attr]
                    return False
                info = c.info("replication")
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
            return True

        wait_until(healthy, timeout_s, "the cluster is healthy with every replica in sync")

    def role(self, node: Node) -> str:
        return str(node.client().info("replication")["role"])

    def primaries(self) -> list[Node]:
        return [n for n in self.alive() if self.role(n) == "master"]

    def node_of_slot(self, slot: int) -> Node:
        """The live master serving ``slot`` (as the nodes themselves say)."""
        for node in self.primaries():
            for start, end, *_ in node.client().execute_command("CLUSTER SLOTS"):
                if start <= slot <= end and int(_[0][1]) == node.port:
                    return node
        raise LookupError(f"no live master serves slot {slot}")

    def replica_of(self, master: Node) -> Node:
        for node in self.alive():
            info = node.client().info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == master.port:
                return node
        raise LookupError(f"the master on port {master.port} has no live replica")

    def move_slot(self, slot: int, target: Node, pause_s: float = 0.05) -> None:
        """Move ``slot`` to ``target`` the way ``redis-cli --cluster reshard`` does:
        IMPORTING / MIGRATING, MIGRATE key by key (``pause_s`` between keys, so that
        commands meet the slot half moved: ASK, TRYAGAIN), then SETSLOT NODE on every
        master."""
        source = self.node_of_slot(slot)
        if source is target:
            raise ValueError(f"slot {slot} is on port {target.port} already")
        src, dst = source.client(), target.client()
        src_id = src.execute_command("CLUSTER MYID")
        dst_id = dst.execute_command("CLUSTER MYID")
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            time.sleep(pause_s)
        for node in self.primaries():
            node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)

    def kill(self, node: Node) -> None:
        """``kill -9`` one node."""
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)

    def wait_promoted(self, replica: Node, timeout_s: float = 60.0) -> None:
        """Until ``replica`` (of a killed master) is a master and every live node says
        the cluster is ok (right after a kill the state is still ok: wait for both)."""
        wait_until(lambda: self.role(replica) == "master", timeout_s, "the replica is promoted")
        self.wait_healthy_state(timeout_s)

    def wait_healthy_state(self, timeout_s: float = 30.0) -> None:
        def ok() -> bool:
            return all(
                n.client().cluster("INFO").get("cluster_state") == "ok"  # type: ignore[union-attr]
                for n in self.alive()
            )

        wait_until(ok, timeout_s, "the cluster state is ok on every live node")

    def restart(self, node: Node) -> None:
        """Start a killed node again (same port and directory): it rejoins the cluster,
        as a replica of whoever took its slots over; returns once it is in sync."""
        node.proc = subprocess.Popen(
            node.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(node.client().ping, 10, f"redis-server on port {node.port} answers")
        self.wait_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGKILL)
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(10)
        self.nodes.clear()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


if __name__ == "__main__":
    cluster = LocalCluster().start()
    print(cluster.url, flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


# -- the same-slot check of a fakeredis run ---------------------------------------------


def _command_table() -> dict[str, tuple[int, int, int]]:
    """fakeredis's command table: name -> (first key, last key, step), as COMMAND says."""
    import json

    import fakeredis

    path = os.path.join(os.path.dirname(fakeredis.__file__), "commands.json")
    with open(path) as f:
        table = json.load(f)
    out = {name: (spec[3], spec[4], spec[5]) for name, spec in table.items()}
    # The table stops at the first key of these; Redis's COMMAND says every argument.
    for name in ("del", "unlink", "exists", "mget", "touch", "watch", "sinter", "sunion"):
        out[name] = (1, -1, 1)
    for name in ("sdiff", "pfcount", "pfmerge", "sinterstore", "sunionstore", "sdiffstore"):
        out[name] = (1, -1, 1)
    out["mset"] = out["msetnx"] = (1, -1, 2)
    return out


_COMMANDS: dict[str, tuple[int, int, int]] = {}
SCRIPT_COMMANDS = {b"eval", b"evalsha", b"eval_ro", b"evalsha_ro", b"fcall", b"fcall_ro"}


def command_keys(fields: list[bytes]) -> list[bytes]:
    """The keys a command names (what a Redis Cluster hashes to route it)."""
    if not _COMMANDS:
        _COMMANDS.update(_command_table())
    name = fields[0].lower()
    if name in SCRIPT_COMMANDS:
        return list(fields[3 : 3 + int(fields[2])])
    if name in (b"xread", b"xreadgroup"):
        lowered = [f.lower() for f in fields]
        rest = fields[lowered.index(b"streams") + 1 :]
        return list(rest[: len(rest) // 2])
    spec = None
    if len(fields) > 1:
        spec = _COMMANDS.get(f"{name.decode()} {fields[1].lower().decode(errors='replace')}")
    spec = spec or _COMMANDS.get(name.decode(errors="replace"))
    if not spec or spec[0] <= 0:
        return []
    first, last, step = spec
    last = len(fields) + last if last < 0 else last
    return list(fields[first : last + 1 : max(step, 1)])


def single_node_only(fields: list[bytes], keys: list[bytes]) -> bool:
    """Commands that may span slots because Wakeful never sends them to a cluster:
    the one XREADGROUP over every owned inbox of the single-node path
    (``Store.read_inbox``; on a cluster it reads per partition, one pipeline per
    master, which the cluster tests run), and a test's own clean-up (``DEL`` /
    ``UNLINK`` of many keys, an ``MGET`` of every lease: Wakeful sends neither
    outside its scripts), the scripts over every held partition of the single-node
    path (``lease_store.py``: RENEW_ALL, FIRST_DUE; on a cluster one call per partition),
    and the sends chained behind their sender's commit, which check the sender's
    metadata (``Store.commit``'s ``sends``: SEND_AFTER, SEND_WAKE_AFTER; on a cluster
    the sends go after the commit)."""
    name = fields[0].lower()
    if name in (b"del", b"unlink", b"mget"):
        return True
    if name == b"evalsha" and len(fields) > 1 and fields[1] in SINGLE_NODE_SCRIPTS:
        return True
    return name == b"xreadgroup" and all(k.endswith(b":inbox") for k in keys)


SINGLE_NODE_SCRIPTS = {s.sha.encode() for s in (RENEW_ALL, FIRST_DUE, SEND_AFTER, SEND_WAKE_AFTER)}


class SlotCheck:
    """Records every command of a fakeredis server whose keys hash to more than one
    cluster slot, and every command a script runs on a key outside its own slot.
    :meth:`install` patches fakeredis (once per process); :attr:`violations` is what
    was seen since the last :meth:`reset`."""

    violations: list[str] = []
    _running = threading.local()  # .slot: the slot of the script this thread runs
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        from fakeredis._socket._base import BaseFakeSocket
        from fakeredis.commands_mixins.scripting_mixin import ScriptingCommandsMixin
        from redis.crc import key_slot

        process, lua_call = BaseFakeSocket._process_command, ScriptingCommandsMixin._lua_redis_call

        def checked_process(self: Any, fields: list[bytes]) -> None:
            keys = command_keys(fields) if fields else []
            slots = {key_slot(k) for k in keys}
            if len(slots) > 1 and not single_node_only(fields, keys):
                cls.violations.append(f"{fields[0]!r} over slots {sorted(slots)}: {keys!r}")
            scripted = bool(fields) and fields[0].lower() in SCRIPT_COMMANDS
            outer = getattr(cls._running, "slot", None)
            spans = len(slots) > 1  # a single-node script (exempted above)
            cls._running.slot = slots.pop() if scripted and slots and not spans else None
            try:
                process(self, fields)
            finally:
                cls._running.slot = outer

        def checked_lua_call(self: Any, runtime: Any, expected: Any, op: bytes, *args: Any) -> Any:
            slot = getattr(cls._running, "slot", None)
            if slot is not None:
                fields = [op, *(a if isinstance(a, bytes) else str(a).encode() for a in args)]
                for key in command_keys(fields):
                    if key_slot(key) != slot:
                        cls.violations.append(
                            f"a script's {op!r} on {key!r} outside its slot {slot}"
                        )
            return lua_call(self, runtime, expected, op, *args)

        BaseFakeSocket._process_command = checked_process  # type: ignore[method-assign]
        ScriptingCommandsMixin._lua_redis_call = checked_lua_call  # type: ignore[method-assign]
        cls._installed = True

    @classmethod
    def reset(cls) -> list[str]:
        seen, cls.violations = cls.violations, []
        return seen
