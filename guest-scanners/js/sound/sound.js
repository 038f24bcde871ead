// The logic of the `sound` scanner and its post-allocator, in plain JavaScript (no WIT imports):
// app.js wires it to the host; `node --test` runs sound.test.js against it on the build machine,
// so everything here takes its inputs as arguments.
//
// ALSA puts every sound card's nodes in /dev/snd, named after the card number C<c>:
//   controlC1           the card's control node (every card has one)
//   pcmC1D0p, pcmC1D0c  playback / capture streams of device 0
//   hwC1D0, midiC1D0, comprC1D0   hardware-dependent, raw MIDI, compressed streams
//   seq, timer          shared by every card: the sequencer and the timer ALSA's PCM code needs
//   by-id/<name> -> ../controlC1   udev's stable names (USB cards)

/** The device type: kubelet sees `<namespace>/sound`. */
export const DEV_TYPE = 'sound';
/** Annotation `sound.wdp.dev/card<c>` holds the card's /dev/snd/by-id name. */
export const BY_ID_ANNOTATION = 'sound.wdp.dev/';
export const DEFAULT_RESCAN_INTERVAL_MS = 30000;
const MAX_U32 = 4294967295;

const CARD_NODE = /^(?:controlC([0-9]+)|pcmC([0-9]+)D[0-9]+[pc]|(?:hw|midi|compr)C([0-9]+)D[0-9]+)$/;

function excerpt(text, max = 80) {
  return text.length <= max ? text : `${text.slice(0, max - 3)}...`;
}

/**
 * Parses SOUND_MATCH: comma-separated substrings of a card's /dev/snd/by-id name
 * (`Focusrite,USB_Audio`). Unset: every card (null). A card without a by-id name (most on-board
 * cards) never matches a filter.
 */
export function parseMatch(value) {
  if (value === undefined || value === null || value.trim() === '') return null;
  const parts = value.split(',').map((p) => p.trim());
  for (const [i, part] of parts.entries()) {
    if (part === '' || part.includes('/')) {
      throw new Error(
        `SOUND_MATCH=${JSON.stringify(excerpt(value))} is not valid: entry ${i + 1} ` +
          `(${JSON.stringify(part)}) ${part === '' ? 'is empty' : "contains '/'"}; expected a ` +
          'comma-separated list of parts of /dev/snd/by-id names, e.g. Focusrite,USB_Audio; ' +
          'unset: every card',
      );
    }
  }
  return parts;
}

/** Parses SOUND_SEQUENCER: `true` adds /dev/snd/seq to every card (default `false`). */
export function parseSequencer(value) {
  if (value === undefined || value === null || value === 'false') return false;
  if (value === 'true') return true;
  throw new Error(
    `SOUND_SEQUENCER=${JSON.stringify(excerpt(value))} is not valid: expected true or false ` +
      '(default false: /dev/snd/seq, shared by every card, is not handed out)',
  );
}

/** Parses RESCAN_INTERVAL_MS (unset: 30000). */
export function parseRescanInterval(value) {
  if (value === undefined || value === null) return DEFAULT_RESCAN_INTERVAL_MS;
  const text = value.trim();
  if (/^[0-9]+$/.test(text)) {
    const n = Number(text);
    if (n >= 1 && n <= MAX_U32) return n;
  }
  throw new Error(
    `RESCAN_INTERVAL_MS=${JSON.stringify(excerpt(value))} is not valid: expected an integer ` +
      `from 1 to ${MAX_U32} (milliseconds, default ${DEFAULT_RESCAN_INTERVAL_MS})`,
  );
}

/** The card number of a per-card node name (`pcmC1D0p` -> 1), or null. */
export function cardOf(name) {
  const m = CARD_NODE.exec(name);
  if (m === null) return null;
  return Number(m[1] ?? m[2] ?? m[3]);
}

/** The card a /dev/snd/by-id link points at (`../controlC1` -> 1), or null. */
export function byIdCard(target) {
  const m = /^(?:\.\.\/|\/dev\/snd\/)controlC([0-9]+)$/.exec(target);
  return m === null ? null : Number(m[1]);
}

/**
 * The device group for the char devices named `nodes` in /dev/snd, with `byId` mapping card
 * numbers to their by-id names. A card is one device (`card<c>`) when its control node exists:
 * its nodes (control first, then by name), plus the shared timer (and sequencer, if asked), each
 * at the same path in the container, and env ALSA_CARD=<c> so ALSA's default card is this one.
 */
export function group(nodes, byId, { match = null, sequencer = false } = {}) {
  const perCard = new Map();
  for (const name of nodes) {
    const card = cardOf(name);
    if (card === null) continue;
    if (!perCard.has(card)) perCard.set(card, []);
    perCard.get(card).push(name);
  }
  const shared = ['timer', ...(sequencer ? ['seq'] : [])].filter((n) => nodes.includes(n));
  const devices = [];
  for (const card of [...perCard.keys()].sort((a, b) => a - b)) {
    const names = perCard.get(card);
    const control = `controlC${card}`;
    if (!names.includes(control)) continue; // half-created card: udev is still at work
    const byIdName = byId.get(card);
    if (match !== null && (byIdName === undefined || !match.some((m) => byIdName.includes(m)))) continue;
    const ordered = [control, ...names.filter((n) => n !== control).sort(), ...shared];
    devices.push({
      id: `card${card}`,
      info: {
        health: 'healthy',
        nodes: ordered.map((n) => ({ containerPath: `/dev/snd/${n}`, hostPath: `/dev/snd/${n}`, permissions: 'rw' })),
        mounts: [],
        envs: [['ALSA_CARD', String(card)]],
        annotations: byIdName === undefined ? [] : [[`${BY_ID_ANNOTATION}card${card}`, byIdName]],
        numaNodes: undefined,
        cdiDevices: [],
      },
    });
  }
  return { devType: DEV_TYPE, devices };
}

/** Deep equality of two trees (plain data), to notify only changes. */
export function sameTree(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * The post-allocate rewrite for one container. Each card's description sets ALSA_CARD to its own
 * number, and the host's default answer keeps the last device's value for a repeated env: with
 * two cards the container's default card would be the last one kubelet listed. This sets
 * ALSA_CARD to the first card in kubelet's order and SOUND_CARDS to all of them ("1,0"), from the
 * control nodes the response hands out; everything else is kept.
 */
export function postAllocateOne(response) {
  const cards = [];
  for (const d of response.devices) {
    const m = /^\/dev\/snd\/controlC([0-9]+)$/.exec(d.containerPath);
    if (m !== null && !cards.includes(m[1])) cards.push(m[1]);
  }
  const envs = response.envs.filter(([k]) => k !== 'ALSA_CARD' && k !== 'SOUND_CARDS');
  if (cards.length > 0) envs.push(['ALSA_CARD', cards[0]]);
  envs.push(['SOUND_CARDS', cards.join(',')]);
  return { ...response, envs };
}

/** post-allocate for every container: one response per request, in the same order. */
export function postAllocate(devType, requests, responses) {
  if (devType !== DEV_TYPE) {
    throw new Error(`post-allocate for dev-type ${JSON.stringify(devType)}: this hook serves only ${JSON.stringify(DEV_TYPE)}`);
  }
  if (requests.length !== responses.length) {
    throw new Error(`post-allocate got ${requests.length} requests but ${responses.length} responses`);
  }
  return responses.map(postAllocateOne);
}
