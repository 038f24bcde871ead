"""The scanner over its fixture (fixture/): `wdp scan` must report exactly fixture/expected.json.

Build the component first (`componentize-py ... -o {{name}}.wasm`, see README.md); `wdp` comes
from PATH, or from `WDP`. The fixture's device nodes are made with mknod, which needs root.
Run: python3 -m unittest
"""

import os
import shutil
import stat
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixture")


def make_dev(listing, dev):
    """Makes the nodes fixture/dev.txt lists (NAME TYPE MAJOR MINOR MODE) under `dev`."""
    with open(listing, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, kind, major, minor, mode = line.split()
            assert kind == "c", f"fixture/dev.txt: only character devices (c): {line!r}"
            path = os.path.join(dev, name)
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(int(major), int(minor)))
            os.chmod(path, int(mode, 8))


class Fixture(unittest.TestCase):
    def test_the_fixture_gives_the_expected_tree(self):
        component = os.environ.get("COMPONENT", os.path.join(HERE, "{{name}}.wasm"))
        self.assertTrue(os.path.exists(component), f"{component} is missing: build it first (README.md)")
        dev = tempfile.mkdtemp(prefix="{{name}}-fixture-dev-")
        try:
            make_dev(os.path.join(FIXTURE, "dev.txt"), dev)
            out = subprocess.run(
                [os.environ.get("WDP", "wdp"), "scan", "--component", component,
                 "--sys-root", os.path.join(FIXTURE, "sys"), "--dev-root", dev,
                 "--expect", os.path.join(FIXTURE, "expected.json")],
                capture_output=True, text=True, check=False,
            )
        finally:
            shutil.rmtree(dev)
        self.assertEqual(out.returncode, 0, f"wdp scan over the fixture:\n{out.stdout}{out.stderr}")


if __name__ == "__main__":
    unittest.main()
