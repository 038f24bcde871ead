"""The logic of the `hidraw` scanner, in plain Python (no bindings): testable with CPython.

Why a separate module: `app.py` needs the generated `wit_world` bindings, which exist only
inside componentize-py's build; everything here takes its inputs as arguments, so
`python3 -m unittest` on the build machine covers the parsing and the tree shape
(see test_hidraw.py).

A HID raw device is `/dev/hidrawN`; the kernel describes it in
`/sys/class/hidraw/hidrawN/device/uevent`:

    DRIVER=hid-generic
    HID_ID=0003:00001050:00000407
    HID_NAME=Yubico YubiKey OTP+FIDO+CCID
    HID_PHYS=usb-0000:00:14.0-2/input1
    HID_UNIQ=

`HID_ID` is BUS:VENDOR:PRODUCT in hex (bus 0003 = USB, 0005 = Bluetooth, 0018 = I2C).
"""

import re

#: The environment variable selecting devices by HID_ID; unset: every hidraw device.
HID_IDS_ENV = "HID_IDS"
#: The environment variable with the longest wait between scans, in milliseconds.
RESCAN_INTERVAL_ENV = "RESCAN_INTERVAL_MS"
DEFAULT_RESCAN_INTERVAL_MS = 30000
MAX_RESCAN_INTERVAL_MS = 2**32 - 1

#: The device type: kubelet sees `<namespace>/hidraw`.
DEV_TYPE = "hidraw"

_NODE_NAME = re.compile(r"hidraw[0-9]+")
_HEX = re.compile(r"[0-9A-Fa-f]{1,8}")
_EXAMPLE = "0003:1050:0407,0005:*:*"


class ConfigError(Exception):
    """A bad environment value; the message names the variable, the value and what is valid."""


def _excerpt(text, limit=80):
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_hid_ids(value):
    """Parses `HID_IDS`: a comma-separated list of BUS:VENDOR:PRODUCT, each field 1 to 8 hex
    digits or `*` (any). None (unset) or only blanks: no filter (returns None). Otherwise a list
    of (bus, vendor, product) with None for `*`."""
    if value is None or value.strip() == "":
        return None
    filters = []
    for i, raw in enumerate(value.split(",")):
        entry = raw.strip()
        fields = entry.split(":")

        def bad(why):
            return ConfigError(
                f"{HID_IDS_ENV}={_excerpt(value)!r} is not valid: entry {i + 1} ({entry!r}) {why}; "
                f"expected a comma-separated list of BUS:VENDOR:PRODUCT, each 1 to 8 hex digits "
                f"or '*', e.g. {_EXAMPLE} (bus 0003 = USB, 0005 = Bluetooth)"
            )

        if len(fields) != 3:
            raise bad(f"has {len(fields)} field(s), not 3")
        parsed = []
        for name, field in zip(("bus", "vendor", "product"), fields):
            if field == "*":
                parsed.append(None)
            elif _HEX.fullmatch(field):
                parsed.append(int(field, 16))
            else:
                raise bad(f"has {name} {field!r}, which is neither hex nor '*'")
        filters.append(tuple(parsed))
    return filters


def parse_rescan_interval(value):
    """Parses `RESCAN_INTERVAL_MS` (unset: 30000)."""
    if value is None:
        return DEFAULT_RESCAN_INTERVAL_MS
    text = value.strip()
    if text.isdigit() and 1 <= int(text) <= MAX_RESCAN_INTERVAL_MS:
        return int(text)
    raise ConfigError(
        f"{RESCAN_INTERVAL_ENV}={_excerpt(value)!r} is not valid: expected an integer from 1 to "
        f"{MAX_RESCAN_INTERVAL_MS} (milliseconds, default {DEFAULT_RESCAN_INTERVAL_MS})"
    )


def parse_uevent(text):
    """The KEY=VALUE lines of a uevent file, as a dict (other lines are ignored)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_hid_id(value):
    """`0003:00001050:00000407` -> (0x3, 0x1050, 0x407); None when malformed or missing."""
    if value is None:
        return None
    fields = value.split(":")
    if len(fields) != 3 or not all(_HEX.fullmatch(f) for f in fields):
        return None
    return tuple(int(f, 16) for f in fields)


def matches(hid_id, filters):
    """True when `filters` is None (no filter) or one filter matches `hid_id` field by field."""
    if filters is None:
        return True
    if hid_id is None:
        return False
    return any(
        all(want is None or want == have for want, have in zip(f, hid_id)) for f in filters
    )


def is_hidraw_name(name):
    """True for `hidraw<digits>`."""
    return _NODE_NAME.fullmatch(name) is not None


def node_number(name):
    """Sort key: hidraw2 before hidraw10."""
    return int(name[len("hidraw"):])


def describe(name, uevent_text, filters):
    """One device, or None when it is filtered out.

    Returns a dict: `id` (the node name), `path` (/dev/<name>), `healthy`, and `annotations`
    [(key, value)] naming the HID id and name. A node whose uevent cannot be read or has no valid
    HID_ID is listed unhealthy when there is no filter (the operator sees it, kubelet never
    allocates it) and left out when there is one (it cannot be matched).
    """
    uevent = parse_uevent(uevent_text) if uevent_text is not None else {}
    hid_id = parse_hid_id(uevent.get("HID_ID"))
    if not matches(hid_id, filters):
        return None
    annotations = []
    if hid_id is not None:
        annotations.append(("hid.wdp.dev/id", "%04x:%04x:%04x" % hid_id))
    name_value = uevent.get("HID_NAME")
    if name_value:
        annotations.append(("hid.wdp.dev/name", name_value))
    return {
        "id": name,
        "path": "/dev/" + name,
        "healthy": hid_id is not None,
        "annotations": annotations,
    }
