"""`hidraw`: a wdp scanner for HID raw devices (/dev/hidrawN), written in Python.

Built with componentize-py against ../../../wit (world `scanner-plugin`):

    componentize-py -d wit -w scanner-plugin componentize app -p . -o hidraw.wasm

(scripts/build-lang-guest.sh python hidraw; the parsing lives in hidraw.py, tested with CPython.)

What it reads, and how:
* /dev through the host's `devfs` interface (the generated bindings): /dev is never preopened,
  so `os.listdir('/dev')` would fail; devfs gives names, kinds and numbers, never contents;
* /sys through plain `os`/`pathlib`: the host preopens it read-only, with its relative symlinks.

Configuration (environment, set per scanner in the host's config):
* `HID_IDS` (optional): comma-separated BUS:VENDOR:PRODUCT in hex, `*` for any field, e.g.
  `0003:1050:0407,0005:*:*`. Unset: every hidraw device.
* `RESCAN_INTERVAL_MS` (default 30000): the longest wait between scans; the scanner rescans as
  soon as the host's `wait-for-change` reports a change under /dev or /sys.
* `SANDBOX_PROBE=1`: instead of scanning, try what the sandbox must deny (see `probe`) and report
  each outcome; for the host's tests, never for deployment.
"""

import os
import sys

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import devfs, notifier
from wit_world.imports.types import Device, DeviceGroup, DeviceInfo, DeviceSpec, Health

import hidraw


def _env(name):
    return os.environ.get(name)


def _read_uevent(name):
    """The uevent of /sys/class/hidraw/<name>/device, or None when it cannot be read."""
    try:
        with open(f"/sys/class/hidraw/{name}/device/uevent", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def scan_once(filters):
    """The current tree: one group `hidraw` (always present, maybe empty)."""
    try:
        entries = devfs.read_dir("/dev")
    except Err as e:
        raise Err(f"cannot list /dev: {e.value}")
    names = sorted(
        (n.name for n in entries if n.kind == devfs.NodeKind.CHAR_DEVICE and hidraw.is_hidraw_name(n.name)),
        key=hidraw.node_number,
    )
    devices = []
    for name in names:
        d = hidraw.describe(name, _read_uevent(name), filters)
        if d is None:
            continue
        info = DeviceInfo(
            health=Health.HEALTHY if d["healthy"] else Health.UNHEALTHY,
            nodes=[DeviceSpec(container_path=d["path"], host_path=d["path"], permissions="rw")],
            mounts=[],
            envs=[],
            annotations=d["annotations"],
            numa_nodes=None,
            cdi_devices=[],
        )
        devices.append(Device(id=d["id"], info=info))
    return [DeviceGroup(dev_type=hidraw.DEV_TYPE, devices=devices)]


def probe():
    """Tries what the sandbox must refuse and reports each outcome, as a tree (type `probe`,
    device `report`, one annotation per probe: `denied: <error>` or `LEAKED: <what>`) and on
    stderr. `PROBE_PORT` is a loopback TCP port the test listens on, so a leak would connect."""
    raw_port = _env("PROBE_PORT") or "1"
    if not raw_port.isdigit() or not 1 <= int(raw_port) <= 65535:
        raise Err(f"PROBE_PORT={raw_port!r} is not valid: expected a TCP port from 1 to 65535 (default 1)")
    port = int(raw_port)
    outcomes = []

    def attempt(key, action):
        try:
            result = action()
            outcome = f"LEAKED: {result!r}"[:200]
        except Exception as e:  # every refusal counts, whatever its type
            outcome = f"denied: {type(e).__name__}: {e}"[:200]
        print(f"probe {key}: {outcome}", file=sys.stderr)
        outcomes.append((key, outcome))

    def connect():
        # componentize-py's stdlib leaves out socket.py, but its CPython has the C module under
        # it (`_socket`, on wasi-libc's wasi:sockets): the same socket()/connect() calls.
        try:
            import socket
        except ImportError:
            import _socket as socket

        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.settimeout(2)
            s.connect(("127.0.0.1", port))
            return "connected to 127.0.0.1:%d" % port
        finally:
            s.close()

    def read_file(path):
        with open(path, "rb") as f:
            return f.read(64)

    attempt("socket-connect", connect)
    attempt("read-etc-hostname", lambda: read_file("/etc/hostname"))
    attempt("read-sys-dotdot", lambda: read_file("/sys/../etc/hostname"))
    attempt("read-dev-node", lambda: read_file("/dev/hidraw0"))
    attempt("write-sys", lambda: open("/sys/class/hidraw/wdp-probe", "w").write("x"))
    info = DeviceInfo(
        health=Health.HEALTHY,
        nodes=[],
        mounts=[],
        envs=[],
        annotations=outcomes,
        numa_nodes=None,
        cdi_devices=[],
    )
    notifier.notify([DeviceGroup(dev_type="probe", devices=[Device(id="report", info=info)])])


class Scanner(exports.Scanner):
    def scan(self) -> None:
        if _env("SANDBOX_PROBE") == "1":
            probe()
            return
        try:
            filters = hidraw.parse_hid_ids(_env(hidraw.HID_IDS_ENV))
            interval = hidraw.parse_rescan_interval(_env(hidraw.RESCAN_INTERVAL_ENV))
        except hidraw.ConfigError as e:
            raise Err(str(e))
        last = None
        while True:
            tree = scan_once(filters)
            if tree != last:
                notifier.notify(tree)
                last = tree
            devfs.wait_for_change(interval)
