// `{{name}}`: a wdp scanner, written in JavaScript. Every character device under /dev that
// matches DEVICE_GLOB is one device of type `{{name}}` (kubelet sees the resource
// `<namespace>/{{name}}`), given to the container that is allocated it at the same path.
//
// JavaScript here has no file API (no wasi:filesystem binding is imported): it sees /dev only,
// through the host's `devfs` interface (names, kinds, device numbers and modes, never contents).
// Health comes from there: a node is Unhealthy while its mode grants its owner no read and write
// (drivers take the rights away from a device they are resetting), Healthy otherwise.
//
// Configuration (environment variables, set per scanner in the host's config):
// * DEVICE_GLOB (default /dev/{{name}}*): the nodes to serve, a path under /dev whose last part may
//   be a pattern (`*`, `?`);
// * RESCAN_INTERVAL_MS (default 30000): the longest wait between scans; the host wakes the
//   scanner as soon as /dev changes.
{{#post-allocator}}
//
// Its post-allocator tells each container which devices it got: {{NAME}}_DEVICES is the
// comma-separated list of their ids.
{{/post-allocator}}

import { readDir, waitForChange } from 'wdp:device-plugin/devfs@{{contract_version}}';
import { notify } from 'wdp:device-plugin/notifier@{{contract_version}}';
import { getEnvironment } from 'wasi:cli/environment@0.2.10';
import { parseGlob, parseRescan, tree, sameTree{{#post-allocator}}, postAllocate{{/post-allocator}} } from './scanner.js';

function env(name) {
  const hit = getEnvironment().find(([k]) => k === name);
  return hit === undefined ? undefined : hit[1];
}

/** Character devices in `dir`, or none when it cannot be listed (it does not exist yet). */
function charDevices(dir) {
  try {
    return readDir(dir).filter((n) => n.kind === 'char-device');
  } catch {
    return [];
  }
}

/**
 * Runs `f`, turning an exception into what componentize-js sends as a WIT `result` error: the
 * thrown value itself must be the payload (a string); an Error object would trap the guest.
 */
function witResult(f) {
  try {
    return f();
  } catch (e) {
    throw e instanceof Error ? e.message : String(e);
  }
}

/** The scan loop: scan, notify when the tree changed, wait for a change, forever. */
function scanForever() {
  const glob = parseGlob(env('DEVICE_GLOB'));
  const interval = parseRescan(env('RESCAN_INTERVAL_MS'));
  let last = null;
  for (;;) {
    const current = tree(glob, charDevices(glob.dir));
    if (last === null || !sameTree(current, last)) {
      notify(current);
      last = current;
    }
    waitForChange(interval);
  }
}

export const scanner = {
  scan() {
    return witResult(scanForever);
  },
};
{{#post-allocator}}

export const postAllocator = {
  postAllocate(devType, requests, responses) {
    return witResult(() => postAllocate(requests, responses));
  },
};
{{/post-allocator}}
