"""`{{name}}`: a wdp scanner, written in Python. Every character device under /dev that matches
`DEVICE_GLOB` is one device of type `{{name}}` (kubelet sees the resource `<namespace>/{{name}}`),
given to the container that is allocated it at the same path.

Health: a node is Healthy while the kernel lists its device number in sysfs
(`/sys/dev/char/<major>:<minor>`), Unhealthy when that is gone (a stale node whose driver went
away): kubelet stops allocating it, and it comes back Healthy on its own.

What it reads, and how:
* /dev through the host's `devfs` interface: /dev is never preopened (`os.listdir('/dev')` fails);
  devfs gives names, kinds and device numbers, never contents;
* /sys through plain `os`: the host preopens it read-only.

Configuration (environment variables, set per scanner in the host's config):
* `DEVICE_GLOB` (default `/dev/{{name}}*`): the nodes to serve, a path under /dev whose last part
  may be a pattern (`*`, `?`, `[...]`);
* `RESCAN_INTERVAL_MS` (default 30000): the longest wait between scans; the host wakes the
  scanner as soon as /dev or /sys changes.
{{#post-allocator}}

Its post-allocator tells each container which devices it got: `{{NAME}}_DEVICES` is the
comma-separated list of their ids.
{{/post-allocator}}
"""

import fnmatch
import os

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import devfs, notifier
from wit_world.imports.types import Device, DeviceGroup, DeviceInfo, DeviceSpec, Health

DEV_TYPE = "{{name}}"
GLOB_ENV = "DEVICE_GLOB"
DEFAULT_GLOB = "/dev/{{name}}*"
RESCAN_ENV = "RESCAN_INTERVAL_MS"
{{#post-allocator}}
DEVICES_ENV = "{{NAME}}_DEVICES"
{{/post-allocator}}


def parse_glob(value):
    """The glob to serve (value: DEVICE_GLOB, None when unset). A bad one raises Err naming the
    variable, the value and what is valid: that is all the operator sees in the host's log."""
    glob = DEFAULT_GLOB if value is None else value
    directory = glob.rsplit("/", 1)[0]
    if not glob.startswith("/dev/") or ".." in glob.split("/") or any(c in directory for c in "*?["):
        raise Err(
            f"{GLOB_ENV}={glob!r} is not valid: expected a path under /dev with a pattern in its "
            f"last part only, e.g. {DEFAULT_GLOB}"
        )
    return glob


def parse_rescan(value):
    """The longest wait between scans, in ms (value: RESCAN_INTERVAL_MS, None when unset)."""
    if value is None:
        return 30000
    if not value.isdigit() or not 1 <= int(value) <= 2**32 - 1:
        raise Err(f"{RESCAN_ENV}={value!r} is not valid: expected an integer from 1 to 4294967295")
    return int(value)


def matches(glob):
    """Character devices under /dev matching `glob`, as (path, node), sorted by path. A missing
    directory gives none."""
    directory, pattern = glob.rsplit("/", 1)
    try:
        entries = devfs.read_dir(directory)
    except Err:
        return []
    return sorted(
        (f"{directory}/{n.name}", n)
        for n in entries
        if n.kind == devfs.NodeKind.CHAR_DEVICE and fnmatch.fnmatchcase(n.name, pattern)
    )


def scan_once(glob):
    """One scan: the tree of the nodes matching `glob` (the type is always there, maybe empty)."""
    devices = []
    for path, node in matches(glob):
        known = os.path.exists(f"/sys/dev/char/{node.major}:{node.minor}")
        info = DeviceInfo(
            health=Health.HEALTHY if known else Health.UNHEALTHY,
            nodes=[DeviceSpec(container_path=path, host_path=path, permissions="rw")],
            mounts=[],
            envs=[],
            annotations=[],
            numa_nodes=None,
            cdi_devices=[],
        )
        devices.append(Device(id=path[len("/dev/"):].replace("/", "_"), info=info))
    return [DeviceGroup(dev_type=DEV_TYPE, devices=devices)]


class Scanner(exports.Scanner):
    """The `scanner` export: called once; scans, notifies when the tree changed, waits for a
    change, forever. An exception escaping here traps the guest: errors are raised as Err."""

    def scan(self) -> None:
        glob = parse_glob(os.environ.get(GLOB_ENV))
        interval = parse_rescan(os.environ.get(RESCAN_ENV))
        last = None
        while True:
            tree = scan_once(glob)
            if tree != last:  # the generated records are dataclasses: == compares them
                notifier.notify(tree)
                last = tree
            devfs.wait_for_change(interval)
{{#post-allocator}}


class PostAllocator(exports.PostAllocator):
    """The `post-allocator` export: adds each container's device ids to its response."""

    def post_allocate(self, dev_type, requests, responses):
        for request, response in zip(requests, responses):
            response.envs.append((DEVICES_ENV, ",".join(request.device_ids)))
        return responses
{{/post-allocator}}
