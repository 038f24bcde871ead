"""Unit tests of hidraw.py, run with the build machine's CPython (`make test` runs them):
`python3 -m unittest discover -s guest-scanners/python/hidraw`."""

import unittest

import hidraw

UEVENT = """DRIVER=hid-generic
HID_ID=0003:00001050:00000407
HID_NAME=Yubico YubiKey OTP+FIDO+CCID
HID_PHYS=usb-0000:00:14.0-2/input1
HID_UNIQ=
MODALIAS=hid:b0003g0001v00001050p00000407
"""


class HidIds(unittest.TestCase):
    def test_unset_or_blank_means_every_device(self):
        self.assertIsNone(hidraw.parse_hid_ids(None))
        self.assertIsNone(hidraw.parse_hid_ids("  "))

    def test_entries_and_wildcards(self):
        self.assertEqual(
            hidraw.parse_hid_ids("0003:1050:0407, 0005:*:*"),
            [(3, 0x1050, 0x407), (5, None, None)],
        )

    def test_errors_name_variable_value_entry_and_what_is_valid(self):
        for value, why in [
            ("0003:1050", "has 2 field(s), not 3"),
            ("0003:1050:0407,3:zz:1", "has vendor 'zz'"),
            ("0003:1050:0407,", "entry 2 ('')"),
            ("1:2:123456789", "has product '123456789'"),
        ]:
            with self.assertRaises(hidraw.ConfigError) as cm:
                hidraw.parse_hid_ids(value)
            msg = str(cm.exception)
            self.assertTrue(msg.startswith(f"HID_IDS={value!r} is not valid"), msg)
            self.assertIn(why, msg)
            self.assertIn("BUS:VENDOR:PRODUCT", msg)


class RescanInterval(unittest.TestCase):
    def test_default_and_bounds(self):
        self.assertEqual(hidraw.parse_rescan_interval(None), 30000)
        self.assertEqual(hidraw.parse_rescan_interval("250"), 250)
        for bad in ["0", "-1", "x", "4294967296", ""]:
            with self.assertRaises(hidraw.ConfigError) as cm:
                hidraw.parse_rescan_interval(bad)
            self.assertIn(f"RESCAN_INTERVAL_MS={bad!r} is not valid", str(cm.exception))


class Describe(unittest.TestCase):
    def test_uevent_gives_id_and_annotations(self):
        d = hidraw.describe("hidraw3", UEVENT, None)
        self.assertEqual(
            d,
            {
                "id": "hidraw3",
                "path": "/dev/hidraw3",
                "healthy": True,
                "annotations": [
                    ("hid.wdp.dev/id", "0003:1050:0407"),
                    ("hid.wdp.dev/name", "Yubico YubiKey OTP+FIDO+CCID"),
                ],
            },
        )

    def test_filters(self):
        self.assertIsNotNone(hidraw.describe("hidraw0", UEVENT, [(3, 0x1050, None)]))
        self.assertIsNotNone(hidraw.describe("hidraw0", UEVENT, [(5, None, None), (None, 0x1050, 0x407)]))
        self.assertIsNone(hidraw.describe("hidraw0", UEVENT, [(5, None, None)]))
        self.assertIsNone(hidraw.describe("hidraw0", UEVENT, [(3, 0x1050, 0x408)]))

    def test_unidentified_nodes(self):
        d = hidraw.describe("hidraw1", None, None)
        self.assertFalse(d["healthy"])
        self.assertEqual(d["annotations"], [])
        self.assertIsNone(hidraw.describe("hidraw1", None, [(None, None, None)]))
        self.assertFalse(hidraw.describe("hidraw1", "HID_ID=zz\n", None)["healthy"])

    def test_names(self):
        self.assertTrue(hidraw.is_hidraw_name("hidraw12"))
        for bad in ["hidraw", "hidrawX", "hidraw1a", "xhidraw1"]:
            self.assertFalse(hidraw.is_hidraw_name(bad), bad)
        self.assertEqual(sorted(["hidraw10", "hidraw2"], key=hidraw.node_number), ["hidraw2", "hidraw10"])


if __name__ == "__main__":
    unittest.main()
