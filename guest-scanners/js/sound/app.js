// `sound`: a wdp scanner for ALSA sound cards (/dev/snd), with its post-allocator, written in
// JavaScript. World `device-plugin-env` (../wit/world.wit): the contract's `device-plugin`
// (scanner + post-allocator in one component) plus the environment, for configuration.
//
// Built with componentize-js (StarlingMonkey), without the HTTP feature so the component imports
// no wasi:http (the host provides none; stubbing it with traps would only hide the mismatch):
//
//   componentize-js --wit wit -n device-plugin-env -d http fetch-event -o sound.wasm app.js
//
// JavaScript here has no file API (no wasi:filesystem binding is imported), so this scanner uses
// /dev only, through the host's `devfs` interface: it lists /dev/snd for the cards' nodes and
// reads the /dev/snd/by-id links (udev's stable names) to name and filter them. The logic is in
// sound.js.
//
// Configuration (environment, per scanner in the host's config; the hook sees the same):
// * SOUND_MATCH (optional): comma-separated parts of by-id names; unset: every card;
// * SOUND_SEQUENCER (default false): also hand out /dev/snd/seq with every card;
// * RESCAN_INTERVAL_MS (default 30000): longest wait between scans; `wait-for-change` wakes the
//   scanner as soon as /dev changes.

import { readDir, readLink, waitForChange } from 'wdp:device-plugin/devfs@0.1.2';
import { notify } from 'wdp:device-plugin/notifier@0.1.2';
import { getEnvironment } from 'wasi:cli/environment@0.2.10';
import * as sound from './sound.js';

function env(name) {
  const hit = getEnvironment().find(([k]) => k === name);
  return hit === undefined ? undefined : hit[1];
}

/** A devfs error (thrown as a ComponentError whose payload is the host's message) as text. */
function why(e) {
  return e && e.payload !== undefined ? String(e.payload) : String(e);
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

/** card number -> by-id name, from /dev/snd/by-id (absent when udev made none). */
function byIdNames() {
  const out = new Map();
  let links;
  try {
    links = readDir('/dev/snd/by-id');
  } catch {
    return out; // no by-id directory: on-board cards only, or no udev
  }
  for (const link of links) {
    if (link.kind !== 'symlink') continue;
    try {
      const card = sound.byIdCard(readLink(`/dev/snd/by-id/${link.name}`));
      if (card !== null && !out.has(card)) out.set(card, link.name);
    } catch {
      // the link vanished between the listing and the read: the next scan sees the new state
    }
  }
  return out;
}

function scanOnce(options) {
  let entries;
  try {
    entries = readDir('/dev/snd');
  } catch (e) {
    const text = why(e);
    // No /dev/snd at all (devfs says `"/dev/snd": not found`): a machine without sound cards,
    // an empty type; the scan goes on and sees cards plugged in later.
    if (/: not found$/.test(text)) return [sound.group([], new Map(), options)];
    throw new Error(`cannot list /dev/snd: ${text}`);
  }
  const nodes = entries.filter((n) => n.kind === 'char-device').map((n) => n.name);
  return [sound.group(nodes, byIdNames(), options)];
}

/** The scan loop: scan, notify when the tree changed, wait for a change, forever. */
function scanForever() {
  const options = {
    match: sound.parseMatch(env('SOUND_MATCH')),
    sequencer: sound.parseSequencer(env('SOUND_SEQUENCER')),
  };
  const interval = sound.parseRescanInterval(env('RESCAN_INTERVAL_MS'));
  let last = null;
  for (;;) {
    const tree = scanOnce(options);
    if (last === null || !sound.sameTree(tree, last)) {
      notify(tree);
      last = tree;
    }
    waitForChange(interval);
  }
}

export const scanner = {
  scan() {
    return witResult(scanForever);
  },
};

export const postAllocator = {
  postAllocate(devType, requests, responses) {
    return witResult(() => sound.postAllocate(devType, requests, responses));
  },
};
